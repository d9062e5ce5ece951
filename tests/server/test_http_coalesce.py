"""A response's head and its first body part leave in one write (coalesce.CoalescingCycle): the
real uvicorn protocol over a recording transport (the socket is the seam)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from torchbay.server.http.limits import HttpLimits, protocol_class


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.open_after_response = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8080)}.get(name)

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.writes.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _exchange(app: Any, request: bytes) -> RecordingTransport:
    # log_config None and no log_level: uvicorn leaves the logging setup of other tests alone
    config = uvicorn.Config(
        app, http=protocol_class(HttpLimits()), lifespan="off", log_config=None, access_log=False
    )
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = RecordingTransport()
    protocol.connection_made(transport)
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
