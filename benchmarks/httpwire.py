"""The load generator's HTTP/1.1 wire format: requests built once, responses parsed incrementally.

A hand-written client side of HTTP/1.1, because the generator must outrun the server it loads:
httpx spends ~100 us of CPU per request, this parser a few. It handles exactly what servers send
back to a benchmark: a status line, headers, and a body framed by ``Content-Length``, by
``Transfer-Encoding: chunked``, or (no framing, or a 1xx/204/304) by neither. Bodies are counted,
not kept: the generator records the status, not the answer.

    parser = ResponseParser()
    for status, body_bytes, keep_alive in parser.feed(chunk): ...
"""

from __future__ import annotations

from dataclasses import dataclass

from torchbay.benchmarks.errors import BenchError

_CRLF = b"\r\n"
_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 64 * 1024  # a response head larger than this is not a server we benchmark


class HttpParseError(BenchError):
    """The server sent something that is not an HTTP/1.1 response."""


def build_request(
    method: str,
    path: str,
    host: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> bytes:
    """One complete HTTP/1.1 request (head + body) with ``Content-Length`` and keep-alive."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    for name, value in (headers or {}).items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise BenchError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body


@dataclass
class _Head:
    status: int
    length: int | None  # None: chunked or read-until-close
    chunked: bool
    keep_alive: bool


def _parse_head(raw: bytes) -> _Head:
    lines = raw.split(_CRLF)
    status_line = lines[0]
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise HttpParseError(f"bad status line {status_line[:80]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise HttpParseError(f"bad status code in {status_line[:80]!r}") from None
    length: int | None = None
    chunked = False
    keep_alive = parts[0] == b"HTTP/1.1"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise HttpParseError(f"bad header line {line[:80]!r}")
        key = name.strip().lower()
        if key == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise HttpParseError(f"bad Content-Length {value[:40]!r}") from None
        elif key == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif key == b"connection":
            token = value.strip().lower()
            if token == b"close":
                keep_alive = False
            elif token == b"keep-alive":
                keep_alive = True
    if chunked:
        length = None
    elif length is None and (100 <= status < 200 or status in (204, 304)):
        length = 0
    return _Head(status, length, chunked, keep_alive)


class ResponseParser:
    """Incremental parser for a stream of responses on one connection (pipelining-safe)."""

    __slots__ = ("_body", "_buf", "_chunk_left", "_head", "_in_trailer")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._head: _Head | None = None
        self._body = 0
        self._chunk_left = -1  # -1: expecting a chunk-size line
        self._in_trailer = False

    def feed(self, data: bytes) -> list[tuple[int, int, bool]]:
        """Consume ``data``; return the responses it completed as (status, body bytes,
        keep-alive). Raises HttpParseError on malformed input."""
        self._buf += data
        done: list[tuple[int, int, bool]] = []
        while True:
            if self._head is None:
                end = self._buf.find(_HEAD_END)
                if end < 0:
                    if len(self._buf) > _MAX_HEAD:
                        raise HttpParseError("response head larger than 64 KiB")
                    return done
                self._head = _parse_head(bytes(self._buf[:end]))
                del self._buf[: end + 4]
                self._body = 0
                self._chunk_left = -1
                self._in_trailer = False
                if self._head.status < 200 and self._head.status != 101:
                    self._head = None  # 100 Continue and friends: the real answer follows
                    continue
            head = self._head
            if head.chunked:
                if not self._read_chunks():
                    return done
            elif head.length is None:
                # No framing: the body runs until the connection closes (see feed_eof).
                self._body += len(self._buf)
                self._buf.clear()
                return done
            else:
                need = head.length - self._body
                take = min(need, len(self._buf))
                del self._buf[:take]
                self._body += take
                if self._body < head.length:
                    return done
            done.append((head.status, self._body, head.keep_alive))
            self._head = None

    def _read_chunks(self) -> bool:
        """Advance through chunked framing; True when the last chunk and trailers are read."""
        buf = self._buf
        while True:
            if self._in_trailer:
                end = buf.find(_CRLF)
                if end < 0:
                    return False
                del buf[: end + 2]
                if end == 0:
                    return True  # empty line: end of trailers
                continue
            if self._chunk_left < 0:
                end = buf.find(_CRLF)
                if end < 0:
                    return False
                size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise HttpParseError(f"bad chunk size {size_text[:20]!r}") from None
                del buf[: end + 2]
                if size == 0:
                    self._in_trailer = True
                    continue
                self._chunk_left = size + 2  # data + its CRLF
            take = min(self._chunk_left, len(buf))
            del buf[:take]
            self._chunk_left -= take
            self._body += take
            if self._chunk_left:
                return False
            self._body -= 2  # the CRLF after the data is framing
            self._chunk_left = -1

    def feed_eof(self) -> tuple[int, int, bool] | None:
        """The connection closed: a read-until-close body is complete; anything else partial
        raises HttpParseError. Returns the completed response, if any."""
        head = self._head
        if head is None:
            if self._buf.strip():
                raise HttpParseError("connection closed inside a response head")
            return None
        if head.length is None and not head.chunked:
            self._head = None
            return head.status, self._body, False
        raise HttpParseError("connection closed inside a response body")

    @property
    def idle(self) -> bool:
        """True between responses (nothing partial buffered)."""
        return self._head is None and not self._buf
