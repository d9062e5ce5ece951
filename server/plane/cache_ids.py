"""The ``id`` of an Open Inference Protocol answer held by the response cache (``cache.py``).

Triton's cache key is the model, its version and the inputs: the request's ``id`` is not in it,
and a hit answers with the asking request's own ``id``. So here too: an OIP answer is stored
without its ``id`` (:func:`without_id`), and a hit gets the asking request's (:func:`with_id`),
in the JSON the worker wrote (REST's body, or the binary extension's JSON header, whose
``Inference-Header-Content-Length`` follows). An answer that came compressed (the request's
``Accept-Encoding``) is held inflated, and answered so: an HTTP answer may always be sent
without a coding. Neither step reads the whole JSON (an answer's data may be megabytes of it):
the worker writes the id among the first members, after the model's name and version, and a hit
gets its id as the first member. A request's JSON is keyed without its id, priority and timeout
(:func:`unscheduled`), its members' texts copied, never parsed. Torch-free.
"""

from __future__ import annotations

import dataclasses
import json

from torchbay.server.errors import TorchbayError
from torchbay.server.plane import json_members, oip_body
from torchbay.server.serving import protocol as p

HEAD_LENGTH = "inference-header-content-length"
_DECODER = json.JSONDecoder()
_SPACE = " \t\n\r"
_LEADING = 3  # the members read for the id: model_name, model_version, id (Triton's order)
_FIRST = ("model_name", "model_version")
# A request's priority and timeout (plane/schedule.py): when it runs, not what it answers.
_SCHEDULE_PARAMS = frozenset(("priority", "timeout"))
_MARKS = (b'"priority"', b'"timeout"', b'"id"')


def unscheduled(head: bytes) -> tuple[bytes, str | None]:
    """An OIP request's JSON as the cache keys it, and its ``id``: without that id, nor the
    ``priority`` and ``timeout`` of its ``parameters`` (nor ``parameters`` left empty), its
    members written ``"name":value`` in their first order (the last of a repeated name wins).
    The values are copied, not parsed: a tensor's data is never read (json_members.py).
    ``head`` itself when it has none of them (or is no JSON object, or its id is no string:
    the worker answers its 400)."""
    if not any(mark in head for mark in _MARKS):
        return head, None
    members = _member_texts(head)
    if members is None:
        return head, None
    has_id = "id" in members
    try:
        rid = json.loads(bytes(members.pop("id"))) if has_id else None
        changed = "parameters" in members and _unschedule(members)
    except (ValueError, RecursionError):
        return head, None
    if not (isinstance(rid, str) if has_id else changed):
        return head, None
    parts: list[bytes | memoryview] = []
    for name, value in members.items():  # the values not copied but once, by the join
        parts += (b"," if parts else b"{", json.dumps(name).encode(), b":", value)
    return b"".join([*parts, b"}"] if parts else [b"{}"]), rid


def _member_texts(head: bytes) -> dict[str, bytes | memoryview] | None:
    """Each top-level member's value of the JSON object ``head``, as text (not copied); None
    when it is none. What the walk does not follow (a byte-order mark, UTF-16) is parsed whole."""
    spans = json_members.members(head)
    if spans is not None:
        view = memoryview(head)
        return {name: view[start:end] for name, (start, end) in spans.items()}
    try:
        doc = json.loads(head)
    except (ValueError, RecursionError):
        return None
    return {k: json.dumps(v).encode() for k, v in doc.items()} if isinstance(doc, dict) else None


def _unschedule(members: dict[str, bytes | memoryview]) -> bool:
    """``parameters`` written compactly, without priority and timeout (gone when nothing is
    left); whether it had either."""
    params = json.loads(bytes(members["parameters"]))
    if not isinstance(params, dict):
        return False  # the worker's 400
    rest = {k: v for k, v in params.items() if k not in _SCHEDULE_PARAMS}
    if rest:
        members["parameters"] = json.dumps(rest, separators=(",", ":")).encode()
    else:
        del members["parameters"]
    return len(rest) < len(params)


def without_id(response: p.WireResponse, limit: int) -> p.WireResponse | None:
    """``response`` as the cache holds it: inflated, its JSON without ``id`` (an answer that is
    no JSON object, or has no id among its first members, as it is); None when it does not
    inflate to at most ``limit`` bytes: it is not stored."""
    names = {k.lower(): k for k in response.headers}
    coding = names.get("content-encoding")
    if coding is not None:
        try:
            body = oip_body.decoded(response.body, response.headers[coding], limit)
        except TorchbayError:
            return None
        headers = {k: v for k, v in response.headers.items() if k != coding}
        response = dataclasses.replace(response, body=body, headers=headers)
    found = _head(response)
    if found is None or b'"id"' not in found[0]:
        return response
    text = found[0].decode("utf-8", "surrogateescape")
    span = _id_span(text)
    if span is None:  # not the worker's order: the whole JSON is read
        return _reread(response, found[0])
    if not span:
        return response  # the worker wrote no id
    return _rewritten(
        response, (text[: span[0]] + text[span[1] :]).encode("utf-8", "surrogateescape")
    )


def with_id(response: p.WireResponse, rid: str | None) -> p.WireResponse:
    """A stored ``response`` (held without an id) as the answer to a request whose ``id`` is
    ``rid`` (None: none): the id becomes its JSON's first member."""
    found = None if rid is None else _head(response)
    if found is None or rid is None:
        return response
    opened = found[0].lstrip()
    if opened[:1] != b"{":
        return response  # no JSON object: it never had an id
    member = b'"id":' + json.dumps(rid).encode()
    rest = opened[1:].lstrip()
    return _rewritten(response, b"{" + member + (b"" if rest[:1] == b"}" else b",") + rest)


def _head(response: p.WireResponse) -> tuple[bytes, int] | None:
    """The answer's JSON and its length (the body, or the binary extension's JSON header);
    None for a compressed answer or a header length past the body."""
    names = {k.lower(): k for k in response.headers}
    if "content-encoding" in names:
        return None
    length = names.get(HEAD_LENGTH)
    body = response.body
    try:
        n = int(response.headers[length]) if length is not None else len(body)
    except ValueError:
        return None
    return (body[:n], n) if 0 <= n <= len(body) else None


def _reread(response: p.WireResponse, head: bytes) -> p.WireResponse:
    """``response`` without the ``id`` of its JSON ``head``, read whole (as it is without one)."""
    try:
        doc = json.loads(head)
    except (ValueError, RecursionError):
        return response
    if not isinstance(doc, dict) or "id" not in doc:
        return response
    del doc["id"]
    return _rewritten(response, json.dumps(doc, separators=(",", ":")).encode())


def _rewritten(response: p.WireResponse, head: bytes) -> p.WireResponse:
    """``response`` with ``head`` for its JSON (its header length follows)."""
    old = _head(response)
    assert old is not None
    headers = dict(response.headers)
    for name in headers:
        if name.lower() == HEAD_LENGTH:
            headers[name] = str(len(head))
    return dataclasses.replace(response, body=head + response.body[old[1] :], headers=headers)


def _id_span(text: str) -> tuple[int, ...] | None:
    """Where the top-level ``id`` member (and its comma) is in the JSON ``text``, read among its
    first members only (the worker writes ``model_name``, ``model_version``, then ``id``): ``()``
    when another member follows the model's first, None when they are not in that order."""
    i = _skip(text, 0)
    if text[i : i + 1] != "{":
        return None
    i, before = i + 1, None
    try:
        for _ in range(_LEADING):
            start = _skip(text, i)
            key, i = _DECODER.raw_decode(text, start)
            i = _skip(text, i)
            if not isinstance(key, str) or text[i : i + 1] != ":":
                return None
            if key != "id" and key not in _FIRST:  # its value (the outputs?) is not read
                return () if before is not None else None
            value, i = _DECODER.raw_decode(text, _skip(text, i + 1))
            i = _skip(text, i)
            if key == "id":
                if text[i : i + 1] == ",":
                    return start, i + 1
                return (start, i) if before is None else (before, i)  # the last member
            if not isinstance(value, str) or text[i : i + 1] != ",":
                return None
            before, i = i, i + 1
    except (ValueError, RecursionError):
        return None
    return None


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i
