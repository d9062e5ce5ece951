"""A parser for Java ``.properties`` files, as TorchServe's ``config.properties`` uses them.

Follows ``java.util.Properties.load`` where it matters to TorchServe configs:

* lines end at ``\\n``, ``\\r`` or ``\\r\\n`` (only: a form feed is whitespace);
* comment lines start (after leading whitespace) with ``#`` or ``!``; blank lines are skipped;
* a line ending in an odd number of backslashes continues on the next line, whose leading
  whitespace is dropped (the ``models={...}`` JSON spans lines this way);
* the key ends at the first unescaped ``=``, ``:`` or whitespace; whitespace and one ``=``/``:``
  after it are skipped; the rest is the value;
* escapes ``\\\\``, ``\\=``, ``\\:``, ``\\#``, ``\\!``, ``\\ ``, ``\\t``, ``\\n``, ``\\r``, ``\\f``,
  ``\\uXXXX``; a backslash before any other character yields that character.

A file that is not UTF-8 is read as ISO 8859-1, as ``Properties.load(InputStream)`` reads every
file (``decoded``; a UTF-8 file stays UTF-8, where Java would misread its non-ASCII letters).

One deliberate difference: trailing whitespace of values is stripped too (Java keeps it, and a
stray space after ``true`` or a port is never what a user meant). A later duplicate key wins.
Torch-free; imports nothing of ours.
"""

from __future__ import annotations

import re

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # Java's; not str.splitlines' \f, \v, \x85, ...
_SEPARATORS = "=:"
_WHITESPACE = " \t\f"


class PropertiesError(ValueError):
    """A malformed escape (``\\u`` without four hex digits)."""


def decoded(raw: bytes) -> str:
    """The text of a ``.properties`` file's bytes: UTF-8, else ISO 8859-1 (which reads any)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def parse_properties(text: str) -> dict[str, str]:
    """Parse the text of a ``.properties`` file into a dict (insertion order = file order)."""
    result: dict[str, str] = {}
    for lineno, logical in _logical_lines(text):
        key, value = _split(logical, lineno)
        result[key] = value
    return result


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join continued lines; drop comments and blanks. Yields (first line number, text)."""
    out: list[tuple[int, str]] = []
    parts: list[str] = []
    start = 0
    for lineno, raw in enumerate(_LINE_BREAK.split(text), start=1):
        line = raw.lstrip(_WHITESPACE)
        if not parts:
            if not line or line[0] in "#!":
                continue
            start = lineno
        if _continues(line):
            parts.append(line[:-1])
            continue
        parts.append(line)
        out.append((start, "".join(parts)))
        parts = []
    if parts:  # a continuation on the last line: Java keeps what it has
        out.append((start, "".join(parts)))
    return out


def _continues(line: str) -> bool:
    backslashes = len(line) - len(line.rstrip("\\"))
    return backslashes % 2 == 1


def _split(line: str, lineno: int) -> tuple[str, str]:
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in _SEPARATORS or ch in _WHITESPACE:
            break
        i += 1
    key_raw = line[:i]
    while i < n and line[i] in _WHITESPACE:
        i += 1
    if i < n and line[i] in _SEPARATORS:
        i += 1
    while i < n and line[i] in _WHITESPACE:
        i += 1
    value_raw = line[i:].rstrip(_WHITESPACE)
    if _continues(value_raw) and len(value_raw) < len(line) - i:
        value_raw += line[i + len(value_raw)]  # an escaped trailing space stays
    return _unescape(key_raw, lineno), _unescape(value_raw, lineno)


def _unescape(s: str, lineno: int) -> str:
    if "\\" not in s:
        return s
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= n:  # a lone trailing backslash (continuation at end of file): dropped
            break
        nxt = s[i + 1]
        if nxt == "u":
            digits = s[i + 2 : i + 6]
            if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise PropertiesError(f"line {lineno}: malformed \\uXXXX escape: {s[i : i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)
