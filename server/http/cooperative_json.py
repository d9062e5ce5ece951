"""``json.loads`` of a request body in steps that yield to the event loop: the same value, or the
same exception with the same message (``JSONDecodeError``, ``UnicodeDecodeError``, the
``ValueError`` of a number past Python's digit limit, ``RecursionError``), with no step holding
the loop much past ``SLICE_S``. One ``json.loads`` of a 6 MB body (KServe v1's
``{"instances": [...]}`` of two million instances) held the loop for seconds: every other request
on the server waited; a thread does not help, the scanner holds the GIL throughout.

Every value is still read by the C scanner of the json module, on bounded pieces of the text:
the body is decoded ``BYTES`` at a time; a container shorter than ``PROBE`` is one scanner call;
a longer one is read member by member, and runs of small members as one call on
``"[" + run + "]"`` (``"{" + run + "}"``), the run ending at a comma found by the text that
separated the last two members (``_signature``). Such a run parses whole only when that comma
separates members of this container (a comma inside a member or a string leaves a bracket or
a string open), so its values are the ones ``json.loads`` makes; a run that does not parse is
read again member by member, and such misses are bounded by the body's length (``spare``).
Errors are found where ``json.loads`` finds them, by the same scanner on the whole text, or
with their positions mapped back to it. Past ``DEPTH`` nested containers every container is one
scanner call (no deeper Python frames), so nesting too deep is a ``RecursionError`` as with
``json.loads`` (the depth where it starts depends on the caller's stack, as it always did). Not
in steps: a body in UTF-16 or UTF-32 is decoded in one call, and a string with a backslash in
every few characters for a whole window is read in one call.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from json.decoder import JSONDecodeError, scanstring
from typing import Any

SLICE_S = 0.002  # the loop gets a turn after this much parsing
BYTES = 1 << 17  # bytes decoded per step
WINDOW = 1 << 14  # characters one scanner call reads at most (a run, a piece of a string)
PROBE = 1 << 12  # a container this short is read in one call
DEPTH = 8  # deeper containers are each one call

_scan = json.JSONDecoder().scan_once  # json.loads' scanner (the C one), its defaults
_WS = re.compile(r"[ \t\n\r]*").match  # json.decoder.WHITESPACE
_PLAIN = re.compile(r"[^\\]{6}").search  # a cut here splits no escape (nor \uXXXX\uXXXX pair)
_HEAD = re.compile(r'[\[ \t\n\r]{0,6}(?:\{[ \t\n\r]*"[^"\\]{0,40}"|\{|")?').match
_MISSED = (JSONDecodeError, StopIteration, RecursionError, ValueError)


class Kept(list[Any]):
    """An array of which ``loads`` kept the first items only (``keep``); ``total``: all it held."""

    total = 0


async def loads(body: bytes, keep: tuple[str, int] | None = None) -> Any:
    """``json.loads(body)``, yielding to the loop between steps. ``keep=(key, n)``: the array
    under ``key`` of a top-level object keeps its first ``n`` items, a ``Kept``: the others are
    read (an error in them is the error) and dropped as they come, never all held at once."""
    parse = _Parse()
    parse.keep = keep
    parse.s = await parse.text(body)
    parse.spare = len(parse.s)
    end = await parse.skip(0)
    value, end = await parse.value(end, 0)
    end = await parse.skip(end)
    if end != len(parse.s):
        raise JSONDecodeError("Extra data", parse.s, end)
    return value


class _Parse:
    def __init__(self) -> None:
        self.s = ""
        self.mark = time.perf_counter()
        self.spare = 0  # characters that runs may still be read in vain
        self.keep: tuple[str, int] | None = None

    async def tick(self) -> None:
        if time.perf_counter() - self.mark >= SLICE_S:
            await asyncio.sleep(0)
            self.mark = time.perf_counter()

    async def text(self, body: bytes) -> str:
        """``body`` decoded as ``json.loads`` decodes it (``detect_encoding``, surrogatepass)."""
        coding = json.detect_encoding(body)
        if coding not in ("utf-8", "utf-8-sig"):  # UTF-16/32: rare, one call
            return body.decode(coding, "surrogatepass")
        data = body[3:] if coding == "utf-8-sig" else body  # as the utf-8-sig codec reports
        parts, start = [], 0
        while start < len(data):
            cut = min(start + BYTES, len(data))
            for _ in range(3):  # never inside a character: not before a continuation byte
                if cut < len(data) and data[cut] & 0xC0 == 0x80:
                    cut -= 1
            try:
                parts.append(data[start:cut].decode("utf-8", "surrogatepass"))
            except UnicodeDecodeError:
                raise _decode_error(data, start) from None
            start = cut
            await self.tick()
        return "".join(parts)

    async def skip(self, i: int) -> int:
        """The index of the first character at or after ``i`` that is not JSON whitespace."""
        while (j := _WS(self.s, i, i + WINDOW).end()) == i + WINDOW:
            i = j
            await self.tick()
        return j

    def scan(self, i: int) -> tuple[Any, int]:
        try:
            return _scan(self.s, i)
        except StopIteration as exc:  # what json's raw_decode makes of it
            raise JSONDecodeError("Expecting value", self.s, exc.value) from None

    async def value(self, i: int, depth: int, keep: int | None = None) -> tuple[Any, int]:
        """The value at ``i`` and the index after it."""
        s = self.s
        first = s[i : i + 1]
        if first == '"':
            return await self.string(i + 1)
        if first not in ("[", "{") or depth >= DEPTH:
            return self.scan(i)
        try:  # a container is read alike from any text that holds it whole
            value, end = _scan(s[i : i + PROBE], 0)
            return value, i + end
        except _MISSED:
            pass  # longer than PROBE (or wrong: read by parts, the error is found there)
        if first == "[":
            return await self.members(i + 1, depth + 1, "[]", keep)
        return await self.members(i + 1, depth + 1, "{}")

    async def string(self, i: int) -> tuple[str, int]:
        """The string whose opening quote is at ``i - 1``, a ``WINDOW`` of it a step."""
        s, parts, j = self.s, [], i
        while True:
            far = j + WINDOW < len(s)  # a cut in the window's last eighth
            plain = _PLAIN(s, j + WINDOW - WINDOW // 8, j + WINDOW) if far else None
            if plain is None:  # the rest fits a window (or escapes all along): one call
                try:
                    text, end = scanstring(s, j, True)
                except JSONDecodeError as exc:  # "Unterminated string" is at the opening quote
                    pos = i - 1 if exc.pos == j - 1 else exc.pos
                    raise JSONDecodeError(exc.msg, s, pos) from None
                return "".join([*parts, text]), end
            piece = s[j : plain.end()] + '"'
            try:
                text, end = scanstring(piece, 0, True)
            except JSONDecodeError as exc:
                raise JSONDecodeError(exc.msg, s, j + exc.pos) from None
            parts.append(text)
            if end < len(piece):  # it closed inside the piece
                return "".join(parts), j + end
            j = plain.end()
            await self.tick()

    async def members(
        self, i: int, depth: int, marks: str, keep: int | None = None
    ) -> tuple[Any, int]:
        """The array (``marks`` ``"[]"``; its first ``keep`` items only: a ``Kept``) or object
        (``"{}"``) whose members start at ``i``; the C scanner's messages where a delimiter is
        wrong."""
        s, close = self.s, marks[1]
        out: Any = {} if close == "}" else [] if keep is None else Kept()
        i = await self.skip(i)
        if s[i : i + 1] == close:
            return out, i + 1
        sig, at, hold = "", 0, 0
        while True:
            run = self.run(i, sig, at, marks) if sig and hold <= 0 and self.spare > 0 else None
            if run is not None:
                if close == "]":
                    out.extend(run[0])
                    _drop(out, keep)
                else:
                    out.update(run[0])
                i = await self.skip(run[1])
                await self.tick()
                continue
            hold = 8 if sig and hold <= 0 else hold - 1  # after a miss: 8 members one by one
            start = i
            if close == "]":
                item, end = await self.value(i, depth)
                out.append(item)
                _drop(out, keep)
            else:
                end = await self.member(i, depth, out)
            i = await self.skip(end)
            if s[i : i + 1] == close:
                _drop(out, keep, done=True)
                return out, i + 1
            if s[i : i + 1] != ",":
                raise JSONDecodeError("Expecting ',' delimiter", s, i)
            comma, i = i, await self.skip(i + 1)
            sig, at = _signature(s, start, end, comma, i)
            await self.tick()

    async def member(self, i: int, depth: int, out: dict[str, Any]) -> int:
        """One ``"key": value`` at ``i`` put in ``out`` (the last of a key wins); its end."""
        s = self.s
        if s[i : i + 1] != '"':
            raise JSONDecodeError("Expecting property name enclosed in double quotes", s, i)
        key, i = await self.string(i + 1)
        i = await self.skip(i)
        if s[i : i + 1] != ":":
            raise JSONDecodeError("Expecting ':' delimiter", s, i)
        keep = self.keep[1] if self.keep and depth == 1 and key == self.keep[0] else None
        value, end = await self.value(await self.skip(i + 1), depth, keep)
        out[key] = value
        return end

    def run(self, i: int, sig: str, at: int, marks: str) -> tuple[Any, int] | None:
        """The members from ``i`` to the last comma in a window that ``sig`` finds, read in one
        call, and the index after that comma; ``None`` when there is none or it is no
        separator of this container."""
        found = self.s.rfind(sig, i, i + WINDOW)
        comma = found + at
        if found < 0 or comma <= i:
            return None
        text = marks[0] + self.s[i:comma] + marks[1]
        try:
            value, end = _scan(text, 0)
        except _MISSED:
            end = -1
        if end != len(text):
            self.spare -= comma - i
            return None
        return value, comma + 1


def _drop(out: Kept, keep: int | None, done: bool = False) -> None:
    """``out``'s items past ``keep`` dropped, counted in its ``total`` (all of them when
    ``done``)."""
    if keep is not None and len(out) > keep:
        out.total += len(out) - keep
        del out[keep:]
    if keep is not None and done:
        out.total += len(out)


def _signature(s: str, start: int, end: int, comma: int, following: int) -> tuple[str, int]:
    """The text around the comma between a member (``start``..``end``) and the next one
    (at ``following``): the closing brackets or quote of the first, the separator, the opening
    brackets (and first key) of the next; and where the comma is in it."""
    tail = end
    while tail > max(start, end - 2) and s[tail - 1] in "]}":
        tail -= 1
    if tail == end and end > start and s[end - 1] == '"':
        tail -= 1
    head = _HEAD(s, following, following + 48)
    return s[tail : head.end() if head else following], comma - tail


def _decode_error(data: bytes, start: int) -> UnicodeDecodeError:
    """The error that decoding all of ``data`` raises, known to lie past ``start`` (the bytes
    before it decoded): found from ``start``, reported against the whole."""
    try:
        data[start:].decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        return UnicodeDecodeError(
            exc.encoding, data, exc.start + start, exc.end + start, exc.reason
        )
    raise AssertionError("a piece did not decode but the rest did")
