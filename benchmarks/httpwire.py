"""The load generator's HTTP/1.1 client. It must outrun the server it loads (httpx spends ~100 us
of CPU per request), so it writes prebuilt request bytes on keep-alive connections (:class:`Conn`)
and parses answers with httptools (llhttp, uvicorn's parser), counting bodies, not keeping them.
"""

from __future__ import annotations

import asyncio

import httptools

from torchbay.benchmarks.errors import BenchError


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


class ResponseParser:
    """Incremental parser for a stream of responses on one connection (pipelining-safe):
    :meth:`feed` returns the responses one chunk completed as (status, body bytes, keep-alive)."""

    __slots__ = ("_body", "_done", "_framed", "_head_done", "_in_message", "_parser")

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._done: list[tuple[int, int, bool]] = []
        self._body = 0
        self._framed = False  # Content-Length or chunked seen: EOF cannot end the body
        self._in_message = False
        self._head_done = False

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._body, self._framed, self._in_message, self._head_done = 0, False, True, False

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._head_done = True

    def on_body(self, body: bytes) -> None:
        self._body += len(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        status = self._parser.get_status_code()
        if status < 200 and status != 101:
            return  # 100 Continue and friends: the real answer follows
        self._done.append((status, self._body, self._parser.should_keep_alive()))

    def feed(self, data: bytes) -> list[tuple[int, int, bool]]:
        """Consume ``data``; return the responses it completed. Raises HttpParseError on
        malformed input."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise HttpParseError(f"bad HTTP response: {exc}") from None
        done, self._done = self._done, []
        return done

    def feed_eof(self) -> tuple[int, int, bool] | None:
        """The connection closed: a read-until-close body (no framing) is complete; anything else
        partial raises HttpParseError. Returns the completed response, if any."""
        if not self._in_message:
            return None
        if self._framed or not self._head_done:
            raise HttpParseError("connection closed inside a response")
        self._in_message = False
        return self._parser.get_status_code(), self._body, False

    @property
    def idle(self) -> bool:
        """True between responses (nothing partial buffered)."""
        return not self._in_message


class Conn(asyncio.Protocol):
    """One keep-alive connection; ``roundtrip`` sends a request and awaits its status."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = ResponseParser()
        self.waiter: asyncio.Future | None = None
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        try:
            responses = self.parser.feed(data)
        except HttpParseError as exc:
            self._fail(exc)
            return
        for status, _size, keep_alive in responses:
            self.open = self.open and keep_alive
            self._settle(status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        try:
            last = self.parser.feed_eof()
        except HttpParseError as err:
            self._fail(err)
            return
        self._settle(ConnectionError("connection closed") if last is None else last[0])

    def _fail(self, exc: Exception) -> None:
        self.open = False
        self._settle(exc)
        if self.transport is not None:
            self.transport.abort()

    def _settle(self, outcome: int | Exception) -> None:
        """Hand the awaited answer (a status, or the error instead) to ``roundtrip``."""
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():
            return
        if isinstance(outcome, Exception):
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)

    async def roundtrip(self, request: bytes) -> int:
        self.waiter = self.loop.create_future()
        assert self.transport is not None
        self.transport.write(request)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
