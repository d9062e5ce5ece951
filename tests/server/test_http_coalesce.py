"""A response's head and its first body part leave in one write (coalesce.CoalescingCycle): the
real uvicorn protocol over a recording transport (the socket is the seam)."""

from __future__ import annotations

import asyncio
from typing import Any

from .http_seam import RecordingTransport, connected


async def _exchange(app: Any, request: bytes) -> RecordingTransport:
    protocol, transport = connected(app)
    protocol.data_received(request)
    for _ in range(50):
        await asyncio.sleep(0.01)
        if protocol.cycle is not None and protocol.cycle.response_complete:
            break
    transport.open_after_response = not transport.closed
    protocol.connection_lost(None)
    return transport


GET = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"


def _run(app: Any, request: bytes = GET) -> RecordingTransport:
    return asyncio.run(_exchange(app, request))


def test_head_and_body_leave_in_one_write() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    transport = _run(app)
    (only,) = transport.writes
    assert only.startswith(b"HTTP/1.1 200 OK\r\n") and only.endswith(b"\r\n\r\n{}")
    assert b"content-length: 2\r\n" in only
    assert transport.open_after_response  # keep-alive


def test_a_stream_sends_its_head_with_the_first_part_then_each_part() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await asyncio.sleep(0.02)
        await send({"type": "http.response.body", "body": b"two"})

    writes = _run(app).writes
    assert len(writes) == 2
    assert b"transfer-encoding: chunked" in writes[0] and writes[0].endswith(b"3\r\none\r\n")
    assert writes[1] == b"3\r\ntwo\r\n0\r\n\r\n"


def test_a_head_without_a_body_becomes_uvicorns_500() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    (only,) = _run(app).writes
    assert only.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert only.endswith(b"Internal Server Error")


def test_http_1_0_closes_after_the_one_write() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    transport = _run(app, b"GET /x HTTP/1.0\r\n\r\n")
    (only,) = transport.writes
    assert only.startswith(b"HTTP/1.1 204 No Content\r\n") and b"connection: close" in only
    assert transport.closed
