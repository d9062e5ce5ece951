"""HTTP edge limits on every port, with raw sockets against a live server with small limits:
slow headers and stalled bodies get 408 and the connection closed (and a stalled request never
reaches the model), oversized or too many headers get 431, idle connections are closed, and
normal requests keep working."""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from torchbay.server.http.edge_rules import connection_cap
from torchbay.server.http.pipelining import FEED_STEP, MAX_PIPELINED

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


def _read_until_closed(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything until the server closes, and whether it did (False: still open when the
    socket's timeout ran out)."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return out, False
        if not chunk:
            return out, True
        out += chunk


def _exchange(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send ``data``, then read until the server closes: (everything read, closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        # The server may answer and close mid-upload; its answer is still readable.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        return _read_until_closed(sock)


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


def test_a_transfer_coding_other_than_chunked_gets_501(server):
    # httptools reads "gzip, chunked" as chunked: the gzipped bytes reached the model as the
    # body (here a plain JSON object, which the probe echoed: 200).
    body = b'{"echo": "coded"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = b"POST /predictions/probe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for codings in (b"gzip, chunked", b"Deflate ,chunked", b"x-foo\r\nTransfer-Encoding: chunked"):
        raw, closed = _exchange(
            _ports(server)["inference"],
            head + b"Transfer-Encoding: " + codings + b"\r\n\r\n" + chunked,
        )
        error = _assert_refused(raw, closed, 501, "NotImplemented")
        assert "is not supported (only chunked)" in error["message"], codings
    ran = httpx.post(f"{server.url}/predictions/probe", json={"ran": True}, timeout=WAIT_S)
    assert "coded" not in ran.json()["ran"]
    raw, closed = _exchange(  # chunked alone, in any case, is read
        _ports(server)["inference"],
        head + b"Transfer-Encoding: Chunked\r\nConnection: close\r\n\r\n" + chunked,
    )
    assert closed and _parse(raw)[0] == 200 and json.loads(_parse(raw)[2])["echo"] == "coded"


def test_an_edge_refusal_of_a_v2_request_has_oips_error_shape(server):
    """OIP's error body is ``{"error": ...}`` (tritonclient reads that key); the edge's refusals
    of a /v2 request were TorchServe's {code, type, message} (found by test_fuzz)."""
    head = b"POST /v2/models/probe/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"
    raw, closed = _exchange(_ports(server)["inference"], head)
    assert closed and _parse(raw)[0] == 501, raw
    assert json.loads(_parse(raw)[2]) == {
        "error": "Transfer-Encoding 'gzip' is not supported (only chunked)"
    }


def test_connections_past_the_cap_get_503_and_the_other_listeners_serve(model_store):
    # Without a cap one client's connections took every file descriptor of the process: no
    # listener accepted another connection (ping, metrics, management all timed out) and the
    # accept loop logged EMFILE tracebacks until the client left.
    live = LiveServer(make_config(model_store, max_connections=4)).start()
    ports = _ports(live)
    try:
        held = [
            socket.create_connection(("127.0.0.1", ports["inference"]), WAIT_S) for _ in range(4)
        ]
        with contextlib.ExitStack() as stack:
            for sock in held:
                stack.enter_context(sock)
            raw, closed = _exchange(ports["inference"], b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            error = _assert_refused(raw, closed, 503, "ServiceUnavailable")
            assert "4 connections" in error["message"] and _parse(raw)[1]["retry-after"] == "1"
            for port in (ports["management"], ports["metrics"]):  # caps of their own
                assert httpx.get(f"http://127.0.0.1:{port}/", timeout=WAIT_S).status_code < 500
            held.pop().close()
            until_served = time.monotonic() + WAIT_S
            while True:  # the server sees the close soon after
                raw, _ = _exchange(
                    ports["inference"], b"GET /ping HTTP/1.1\r\nConnection: close\r\n\r\n"
                )
                if _parse(raw)[0] == 200 or time.monotonic() > until_served:
                    break
            assert _parse(raw)[0] == 200, raw
    finally:
        live.stop()


def test_the_default_cap_is_a_share_of_the_raised_open_file_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(
            f"the hard open-file limit is {hard}: no room above a 1024 soft limit to raise it"
        )
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        share = connection_cap(3)  # raises the soft limit to the hard one first
        raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert raised > 256 and share == max(64, min(raised, 1 << 20) * 3 // 4 // 3)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_client_that_pipelines_without_reading_has_few_requests_parsed_ahead(server):
    # httptools parsed each whole read and uvicorn read again after every answer: a client that
    # pipelined 12 MB of small requests without reading its answers made the server hold every
    # one of them parsed (~1.5 KB each: 500 MB), here thousands.
    one = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
    [(protocols, _)] = [
        (s.server_state.connections, _) for n, s, _ in server.server._servers if n == "inference"
    ]
    with socket.create_connection(("127.0.0.1", _ports(server)["inference"]), WAIT_S) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(2)
        with contextlib.suppress(TimeoutError):
            sock.sendall(one * 50_000)  # stops once the server stops reading
        deepest, until = 0, time.monotonic() + 3
        while time.monotonic() < until:  # the deepest the queue gets while they are answered
            deepest = max([deepest, *(len(p.pipeline) for p in list(protocols))])
            time.sleep(0.01)
        assert 0 < deepest <= MAX_PIPELINED + FEED_STEP // len(one), deepest
    assert httpx.get(f"{server.url}/ping", timeout=WAIT_S).status_code == 200


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


def _expect(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
    ).encode()


def _read_answer(sock: socket.socket) -> bytes:
    """One response with a content-length body (an interim 100 Continue is returned alone)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    code, headers, body = _parse(data)
    while code != 100 and len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return data.partition(b"\r\n\r\n")[0] + b"\r\n\r\n" + body


def _rest(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything until the server closes, and whether it did (False: open but silent for 2 s)."""
    sock.settimeout(2.0)
    return _read_until_closed(sock)


def test_expect_100_continue_answered_from_the_headers_closes_the_connection(server):
    # RFC 9110 10.1.1: the client was never told to send its body, so whether it will is
    # unknown and the connection cannot carry another request. The answer says so, and the
    # connection closes (before this, the next request was read as the old one's body).
    port = _ports(server)["inference"]
    with socket.create_connection(("127.0.0.1", port), WAIT_S) as sock:
        sock.sendall(_expect("/predictions/nope", 2048))  # the body never comes
        code, headers, body = _parse(_read_answer(sock))
        assert code == 404 and headers["connection"] == "close", headers
        assert json.loads(body)["code"] == 404
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        rest, closed = _rest(sock)
        assert closed and rest == b"", rest  # nothing misread as a request
    with socket.create_connection(("127.0.0.1", port), WAIT_S) as sock:
        sock.sendall(_expect("/predictions/nope", 2048))
        assert _parse(_read_answer(sock))[0] == 404
        sock.sendall(b"x" * 2048)  # a client that sends the body anyway: discarded, no reset
        assert _rest(sock) == (b"", True)
    # Asked for its body (an admitted request), the client gets 100 Continue, then its answer,
    # and the connection stays open for the next request.
    with socket.create_connection(("127.0.0.1", port), WAIT_S) as sock:
        body = b'{"echo": "on"}'
        sock.sendall(_expect("/predictions/probe", len(body)))
        assert _read_answer(sock).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        code, headers, answer = _parse(_read_answer(sock))
        assert code == 200 and "connection" not in headers and json.loads(answer)["echo"] == "on"
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _parse(_read_answer(sock))[0] == 200


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_uploads_with_expect_on_its_defaults(server):
    # curl sends Expect: 100-continue for bodies over 1 KiB (7.x) or 1 MiB (8.x): a refused
    # upload and an accepted one, on curl's defaults, each get their own answer.
    url = f"http://127.0.0.1:{_ports(server)['inference']}"
    body = json.dumps({"echo": "curl", "pad": "p" * 2_000_000})  # over both thresholds
    out = subprocess.run(
        ["curl", "-sS", "-w", "%{http_code}\\n", "--data-binary", "@-",
         "-H", "Content-Type: application/json",
         *(arg for path in ("nope", "probe", "nope")
           for arg in ("-o", "/dev/null", f"{url}/predictions/{path}"))],
        input=body.encode(), capture_output=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().split() == ["404", "200", "404"], out.stderr
