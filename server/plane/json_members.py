"""A JSON object's top-level members, read without building the values nobody asked for.

The frontend needs a few small members of an Open Inference Protocol body (its ``parameters``:
priority, timeout, sequence; the first input's ``shape``) before it queues the request, on the
event loop. ``json.loads`` of the whole body builds every number of its tensors' ``data``: 0.8 s
for 4 MB of floats on this machine, and the C call holds the GIL, so no other request moves
meanwhile (a thread does not help). Here the body's structure is walked with regular expressions
that skip a value's text in C, and only the value asked for is parsed.

Exact for valid JSON: the value found is the one ``json.loads`` gives (the last of a repeated
name wins). Where the text is not one these patterns follow (another encoding, a byte-order
mark, a malformed member on the way), :func:`at_path` parses the whole body, so its errors are
``json.loads``' own. Text that is malformed only inside a value that is
skipped is not seen here: the worker parses the whole body and answers that request's 400.
Torch-free.
"""

from __future__ import annotations

import json
import re
from typing import Any

_STR = rb'"(?:[^"\\]++|\\.)*+"'
_PLAIN = rb'[^\[\]{}"]++'  # no bracket and no string: numbers, commas, colons, spaces
_ITEM = _PLAIN + rb"|" + _STR
_LEAF = rb"\[(?:" + _ITEM + rb")*+\]"  # an array of numbers or strings
_STRING = re.compile(_STR)
_SPACE = re.compile(rb"[ \t\n\r]*+")
# A container's inside up to its next bracket, arrays two deep skipped whole (tensor data).
_RUN = re.compile(rb"(?:" + _ITEM + rb"|\[(?:" + _ITEM + rb"|" + _LEAF + rb")*+\])*+")
_SCALAR = re.compile(
    rb"-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?(?:[eE][-+]?[0-9]++)?|true|false|null|NaN|-?Infinity"
)
_OPEN = b"[{"
_SMALL = 1024  # bytes: json.loads reads less faster than the walk (3 µs for 300 against 12-30)

Spans = dict[str, tuple[int, int]]
Path = tuple[str | int, ...]
MISSING: Any = object()  # what :func:`at_path` answers where the path leads nowhere


def at_path(data: bytes, path: Path) -> Any:
    """The value at ``path`` (member names and array indexes, from the top) in the JSON
    ``data``, parsed; :data:`MISSING` where there is none. Raises ``json.loads``' ValueError or
    RecursionError when ``data`` is no JSON (it is parsed whole where the walk cannot follow)."""
    span = _span_at(data, path) if len(data) > _SMALL else None
    if span is not None:
        if span is MISSING:
            return MISSING
        try:
            return json.loads(data[span[0] : span[1]])
        except (ValueError, RecursionError):
            pass  # a malformed value: json.loads of the whole body says how
    value = json.loads(data)
    for step in path:
        if not _has(value, step):
            return MISSING
        value = value[step]
    return value


def _has(value: Any, step: str | int) -> bool:
    if isinstance(step, str):
        return isinstance(value, dict) and step in value
    return isinstance(value, list) and step < len(value)


def members(data: bytes) -> Spans | None:
    """Where each top-level member's value of the JSON object ``data`` is (the last of a
    repeated name); None when ``data`` is not an object these patterns follow to its end."""
    found = _object_at(data, _SPACE.match(data).end())
    if found is None or _SPACE.match(data, found[1]).end() != len(data):
        return None
    return found[0]


def _span_at(data: bytes, path: Path) -> Any:
    """Where the value at ``path`` is; MISSING where there is none; None where these patterns
    do not follow the text."""
    if not path or not isinstance(path[0], str):
        return None
    spans = members(data)
    if spans is None:
        return None
    span: Any = spans.get(path[0], MISSING)
    for step in path[1:]:
        if span is MISSING:
            return MISSING
        if isinstance(step, str):
            found = _object_at(data, span[0])
            span = MISSING if found is None else found[0].get(step, MISSING)
        else:
            span = _element(data, span[0], step)
        if span is None:
            return None
    return span


def _object_at(data: bytes, i: int) -> tuple[Spans, int] | None:
    """The members of the object that starts at ``data[i]`` and where it ends; None when
    there is none these patterns follow."""
    if data[i : i + 1] != b"{":
        return None
    spans: Spans = {}
    i = _SPACE.match(data, i + 1).end()
    if data[i : i + 1] == b"}":
        return spans, i + 1
    while True:
        key = _STRING.match(data, i)
        if key is None:
            return None
        name = _name(data[key.start() : key.end()])
        i = _SPACE.match(data, key.end()).end()
        if name is None or data[i : i + 1] != b":":
            return None
        start = _SPACE.match(data, i + 1).end()
        end = value_end(data, start)
        if end is None:
            return None
        spans[name] = (start, end)
        i = _SPACE.match(data, end).end()
        if data[i : i + 1] == b"}":
            return spans, i + 1
        if data[i : i + 1] != b",":
            return None
        i = _SPACE.match(data, i + 1).end()


def _element(data: bytes, i: int, index: int) -> Any:
    """Where element ``index`` of the array that starts at ``data[i]`` is; MISSING when it is
    no array or a shorter one; None where these patterns do not follow it."""
    if data[i : i + 1] != b"[":
        return MISSING
    i = _SPACE.match(data, i + 1).end()
    if data[i : i + 1] == b"]":
        return MISSING
    for _ in range(index):
        end = value_end(data, i)
        if end is None:
            return None
        i = _SPACE.match(data, end).end()
        if data[i : i + 1] == b"]":
            return MISSING
        if data[i : i + 1] != b",":
            return None
        i = _SPACE.match(data, i + 1).end()
    end = value_end(data, i)
    return None if end is None else (i, end)


def value_end(data: bytes, i: int) -> int | None:
    """Where the JSON value that starts at ``data[i]`` ends; None when it does not."""
    head = data[i : i + 1]
    if head == b'"':
        found = _STRING.match(data, i)
        return None if found is None else found.end()
    if head and head in _OPEN:
        return _container_end(data, i)
    found = _SCALAR.match(data, i)
    return None if found is None else found.end()


def _container_end(data: bytes, i: int) -> int | None:
    """Where the array or object opened at ``data[i]`` closes: one step per bracket that the
    run (strings, scalars, arrays of them two deep) does not take whole."""
    depth, i = 1, i + 1
    while True:
        i = _RUN.match(data, i).end()
        mark = data[i : i + 1]
        if not mark or mark == b'"':
            return None  # the end of the text, or a string that does not close
        depth += 1 if mark in _OPEN else -1
        i += 1
        if depth == 0:
            return i


def _name(text: bytes) -> str | None:
    """A member's name from its quoted text; None when it is no JSON string."""
    try:
        return text[1:-1].decode() if b"\\" not in text else json.loads(text)
    except ValueError:  # UnicodeDecodeError too
        return None
