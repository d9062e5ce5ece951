"""HTTP edge limits on every port, with raw sockets against a live server with small limits:
slow headers and stalled bodies get 408 and the connection closed (and a stalled request never
reaches the model), oversized or too many headers get 431, idle connections are closed, and
normal requests keep working."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import LiveServer, make_config, probe_models

pytestmark = pytest.mark.slow

LIMITS = {
    "http_header_timeout_s": 0.5,
    "http_body_timeout_s": 0.5,
    "keep_alive_timeout_s": 0.5,
    "max_header_size": 4096,
    "max_header_count": 32,
}
WAIT_S = 30  # the longest any read waits: a hang fails the test instead of blocking it


@pytest.fixture(scope="module")
def server(model_store: Path) -> Iterator[LiveServer]:
    live = LiveServer(
        make_config(model_store, models=probe_models(), enable_model_api=True, **LIMITS)
    ).start()
    yield live
    live.stop()


def _ports(server: LiveServer) -> dict[str, int]:
    ports = server.server.state.ports
    return {"inference": ports.inference, "management": ports.management, "metrics": ports.metrics}


def _exchange(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send ``data``, then read until the server closes: (everything read, closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        # The server may answer and close mid-upload; its answer is still readable.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        out = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return out, False
            if not chunk:
                return out, True
            out += chunk


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def _assert_refused(raw: bytes, closed: bool, status: int, type_: str) -> dict:
    assert closed, f"connection left open after {raw!r}"
    code, headers, body = _parse(raw)
    assert code == status, raw
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)
    assert error["code"] == status and error["type"] == type_ and error["message"]
    return error


def _describe(server: LiveServer) -> dict:
    [probe] = httpx.get(f"{server.management_url}/models/probe", timeout=WAIT_S).json()
    return probe


def _probe_metric(server: LiveServer, name: str) -> float:
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=WAIT_S).text
    lines = [ln for ln in text.splitlines() if ln.startswith(name) and 'model="probe"' in ln]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def test_unfinished_headers_get_408_then_eof_on_every_port(server):
    for name, port in _ports(server).items():
        raw, closed = _exchange(port, b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        error = _assert_refused(raw, closed, 408, "RequestTimeout")
        assert "headers" in error["message"], name


def test_stalled_body_gets_408_and_never_reaches_the_model(server):
    warm = httpx.post(f"{server.url}/predictions/probe", json={"echo": "warm"}, timeout=WAIT_S)
    assert warm.status_code == 200, warm.text
    before = _describe(server)["metrics"]["requests"]
    served = [
        _probe_metric(server, m)
        for m in ("torchbay_request_latency_seconds_count", "torchbay_handler_seconds_count")
    ]
    assert all(served), served  # the series exist: the comparison below can fail
    # A complete JSON object, but 100 bytes declared: run on what arrived, it would echo.
    body = b'{"echo": "stalled"}'
    raw, closed = _exchange(
        _ports(server)["inference"],
        b"POST /predictions/probe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + body,
    )
    error = _assert_refused(raw, closed, 408, "RequestTimeout")
    assert "body" in error["message"]
    probe = _describe(server)
    assert probe["metrics"]["requests"] == before  # never admitted
    assert probe["jobQueueStatus"]["pendingRequests"] == 0
    assert served == [
        _probe_metric(server, m)
        for m in ("torchbay_request_latency_seconds_count", "torchbay_handler_seconds_count")
    ]
    ran = httpx.post(f"{server.url}/predictions/probe", json={"ran": True}, timeout=WAIT_S)
    assert ran.status_code == 200, ran.text
    assert "stalled" not in ran.json()["ran"]
    # Counted as nginx's 499 (the client got the protocol's 408), never as the client's 400.
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=WAIT_S).text
    assert any(
        ln.startswith("torchbay_requests_total") and 'code="499"' in ln for ln in text.splitlines()
    )
    assert not any('code="400"' in ln and 'model="probe"' in ln for ln in text.splitlines())

    # The management app (FastAPI) too: a stalled registration registers nothing.
    raw, closed = _exchange(
        _ports(server)["management"],
        b"POST /models HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"url": "tiny.mar"}',
    )
    _assert_refused(raw, closed, 408, "RequestTimeout")
    listing = httpx.get(f"{server.management_url}/models", timeout=WAIT_S).json()
    assert [m["modelName"] for m in listing["models"]] == ["probe"]


def test_a_megabyte_of_headers_gets_431(server):
    for port in _ports(server).values():
        big = b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
        raw, closed = _exchange(port, big)
        error = _assert_refused(raw, closed, 431, "RequestHeaderFieldsTooLarge")
        assert "4096 bytes" in error["message"]
    # Many medium headers past the size, and a long request line, are the same.
    many = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 200) for i in range(30))
    raw, closed = _exchange(_ports(server)["inference"], b"GET /ping HTTP/1.1\r\n" + many + b"\r\n")
    _assert_refused(raw, closed, 431, "RequestHeaderFieldsTooLarge")
    long_url = b"GET /ping?" + b"q" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    raw, closed = _exchange(_ports(server)["inference"], long_url)
    _assert_refused(raw, closed, 431, "RequestHeaderFieldsTooLarge")


def test_a_thousand_headers_get_431(server):
    headers = b"".join(b"X-%d: 1\r\n" % i for i in range(1000))
    raw, closed = _exchange(
        _ports(server)["management"], b"GET /models HTTP/1.1\r\n" + headers + b"\r\n"
    )
    error = _assert_refused(raw, closed, 431, "RequestHeaderFieldsTooLarge")
    assert "more than 32 request headers" in error["message"]


def test_idle_connections_are_closed(server):
    port = _ports(server)["inference"]
    # After a response, the keep-alive timeout closes the connection.
    raw, closed = _exchange(port, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = _parse(raw)
    assert (status, json.loads(body)) == (200, {"status": "Healthy"})
    assert closed
    # A connection that never sends a byte is closed without an answer.
    raw, closed = _exchange(port, b"")
    assert (raw, closed) == (b"", True)


def test_normal_requests_still_work_and_the_server_stays_ready(server):
    # Headers and body in separate writes, each well within the limits.
    with socket.create_connection(("127.0.0.1", _ports(server)["inference"]), WAIT_S) as sock:
        sock.sendall(b"POST /predictions/probe HTTP/1.1\r\nHost: x\r\n")
        sock.sendall(b"Content-Type: application/json\r\nContent-Length: 16\r\n\r\n")
        sock.sendall(b'{"echo": ')
        sock.sendall(b'"fine"}')
        data = b""
        while b'"fine"' not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ")
    # Pipelined requests in one write: both answered, in order.
    two = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nConnection: close\r\n\r\n"
    raw, closed = _exchange(_ports(server)["inference"], two)
    assert closed and raw.count(b"HTTP/1.1 200 OK") == 2, raw
    exactly = b"GET /ping HTTP/1.1\r\n" + b"X-Pad: " + b"p" * 3000 + b"\r\n\r\n"
    raw, _ = _exchange(_ports(server)["inference"], exactly)
    assert _parse(raw)[0] == 200
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=WAIT_S).json() == {"ready": True}
    assert httpx.get(f"{server.metrics_url}/metrics", timeout=WAIT_S).status_code == 200
    assert _describe(server)["status"] == "READY"
