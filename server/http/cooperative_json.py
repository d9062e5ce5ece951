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
with their positions mapped back to it. The containers being read are a stack of their own, not
a Python frame each, so a container at any depth is read in steps (it was one scanner call past
8 levels: one deep, long container held the loop as ``json.loads`` did). The scanner is called
as many Python frames down as its container is deep (``_scan_at``), so it runs out of stack
where ``json.loads`` would: nesting too deep is a ``RecursionError`` as with ``json.loads``,
raised there (the depth where it starts depends on the caller's stack, as it always did). Not
in steps: a body in UTF-16 or UTF-32 is decoded in one call, and a string with a backslash in
every few characters for a whole window is read in one call (the C decoder and scanner:
milliseconds a megabyte).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from json.decoder import JSONDecodeError, scanstring
from typing import Any

SLICE_S = 0.002  # the loop gets a turn after this much parsing
BYTES = 1 << 17  # bytes decoded per step
WINDOW = 1 << 14  # characters one scanner call reads at most (a run, a piece of a string)
PROBE = 1 << 12  # a container this short is read in one call

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
    value, end = await parse.value(end)
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

    async def value(self, i: int) -> tuple[Any, int]:
        """The value at ``i`` and the index after it. The containers it opens are ``stack``;
        a value read is handed to the innermost, and each one closed to the next."""
        stack: list[_Open] = []
        while True:
            value, i, opened = await self.atom(i, len(stack), self._kept(stack))
            if opened is not None:
                if len(stack) >= sys.getrecursionlimit():
                    raise RecursionError("maximum recursion depth exceeded while decoding JSON")
                stack.append(opened)
                i = await self.skip(i)
                await self.tick()
                if self.s[i : i + 1] != opened.close:
                    i = await self.begin(opened, i, len(stack))
                    continue
                value, i = stack.pop().done(), i + 1
            while stack:  # ``value`` ends at ``i``: its container's next member, or its end
                top, end = stack[-1], i
                top.add(value)
                i = await self.skip(i)
                if self.s[i : i + 1] == top.close:
                    value, i = stack.pop().done(), i + 1
                    continue
                if self.s[i : i + 1] != ",":
                    raise JSONDecodeError("Expecting ',' delimiter", self.s, i)
                comma, i = i, await self.skip(i + 1)
                top.sig, top.at = _signature(self.s, top.start, end, comma, i)
                await self.tick()
                i = await self.begin(top, i, len(stack))
                break
            else:
                return value, i

    def _kept(self, stack: list[_Open]) -> int | None:
        """How many items the array about to be read keeps: ``keep``'s, when it is the value of
        ``keep``'s key in the top-level object."""
        top = stack[0] if len(stack) == 1 else None
        if self.keep and top is not None and top.close == "}" and top.key == self.keep[0]:
            return self.keep[1]
        return None

    async def atom(self, i: int, depth: int, keep: int | None) -> tuple[Any, int, _Open | None]:
        """The value at ``i``, ``depth`` containers deep, read whole (a string in steps, a
        container shorter than ``PROBE`` in one call) and the index after it; or a container
        opened (``_Open``) and the index after its bracket."""
        s = self.s
        first = s[i : i + 1]
        if first == '"':
            return (*await self.string(i + 1), None)
        if first not in ("[", "{"):
            return (*self.scan(i), None)
        try:  # a container is read alike from any text that holds it whole
            value, end = _scan_at(depth, s[i : i + PROBE])
            return value, i + end, None
        except RecursionError:  # json.loads, as deep, runs out of stack here too
            raise
        except _MISSED:
            pass  # longer than PROBE (or wrong: read by parts, the error is found there)
        return None, i + 1, _Open("]" if first == "[" else "}", keep)

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

    async def begin(self, top: _Open, i: int, depth: int) -> int:
        """From ``i``, the members of ``top`` (``depth`` containers deep) that runs read (while
        they parse), then the start of its next member: where that member's value begins (an
        object's key read)."""
        while top.sig and top.hold <= 0 and self.spare > 0:
            run = self.run(i, top.sig, top.at, top.marks, depth)
            if run is None:
                break
            top.extend(run[0])
            i = await self.skip(run[1])
            await self.tick()
        top.hold = 8 if top.sig and top.hold <= 0 else top.hold - 1  # after a miss: 8 one by one
        top.start, s = i, self.s
        if top.close == "]":
            return i
        if s[i : i + 1] != '"':
            raise JSONDecodeError("Expecting property name enclosed in double quotes", s, i)
        top.key, i = await self.string(i + 1)
        i = await self.skip(i)
        if s[i : i + 1] != ":":
            raise JSONDecodeError("Expecting ':' delimiter", s, i)
        return await self.skip(i + 1)

    def run(self, i: int, sig: str, at: int, marks: str, depth: int) -> tuple[Any, int] | None:
        """The members from ``i`` to the last comma in a window that ``sig`` finds, read in one
        call, and the index after that comma; ``None`` when there is none or it is no
        separator of this container."""
        found = self.s.rfind(sig, i, i + WINDOW)
        comma = found + at
        if found < 0 or comma <= i:
            return None
        text = marks[0] + self.s[i:comma] + marks[1]
        try:
            value, end = _scan_at(depth - 1, text)
        except _MISSED:
            end = -1
        if end != len(text):
            self.spare -= comma - i
            return None
        return value, comma + 1


def _scan_at(depth: int, text: str) -> tuple[Any, int]:
    """``_scan(text, 0)`` called ``depth`` Python frames down: a container ``depth`` deep in
    the body leaves the scanner the recursion budget ``json.loads`` would have left it there
    (the stack of open containers takes no frames of its own)."""
    if depth > 0:
        return _scan_at(depth - 1, text)
    return _scan(text, 0)


class _Open:
    """A container being read member by member: an array (``close`` "]"; its first ``keep``
    items only, a ``Kept``) or an object ("}", ``key`` the member being read); ``sig``, ``at``
    and ``hold``: the runs of its members (``_Parse.run``); ``start``: its member being read."""

    def __init__(self, close: str, keep: int | None) -> None:
        self.close, self.keep = close, keep
        self.marks = "[]" if close == "]" else "{}"
        self.out: Any = {} if close == "}" else [] if keep is None else Kept()
        self.sig, self.at, self.hold, self.start = "", 0, 0, 0
        self.key = ""

    def add(self, value: Any) -> None:
        if self.close == "}":
            self.out[self.key] = value  # the last of a key wins
        else:
            self.out.append(value)
            _drop(self.out, self.keep)

    def extend(self, run: Any) -> None:
        if self.close == "}":
            self.out.update(run)
        else:
            self.out.extend(run)
            _drop(self.out, self.keep)

    def done(self) -> Any:
        if self.close == "]":
            _drop(self.out, self.keep, done=True)
        return self.out


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
