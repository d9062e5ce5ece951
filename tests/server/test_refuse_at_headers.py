"""Refusal at the headers (server.http.early): while a model version refuses newcomers, the
inference listener's HTTP protocol answers their 503 itself, before any ASGI task, and the
answer, its counting and the connection are what the ASGI path gives.

A live server with two models from the probe archive: ``idle`` has no worker (every request is
refused, 503 NoWorker) and ``live`` has one. A refusal presses ``idle`` for PRESSURE_S, which
these tests lengthen (``_pressed_while_testing``) so that a stall of the loaded host between two
requests cannot end the pressure and send a request down the ASGI path unnoticed.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from torchbay.server.errors import Unauthorized
from torchbay.server.http import early
from torchbay.server.http.inference import InferenceApp
from torchbay.server.observe.logs import ACCESS_FIELDS, ACCESS_LOGGER
from torchbay.server.plane import DataPlane
from torchbay.server.serving import admission

from .conftest import LiveServer, errors_left_in_cycles, make_config

pytestmark = pytest.mark.slow

BODY = b"x" * (48 * 1024)
PATHS = ("/predictions/idle", "/v2/models/idle/infer", "/v1/models/idle:predict")
WAIT_S = 30


def _models() -> dict[str, Any]:
    probe = {"marName": "probe.mar", "defaultVersion": True}
    return {
        "idle": {"1.0": {**probe, "minWorkers": 0, "maxWorkers": 0}},
        "live": {"1.0": {**probe, "minWorkers": 1, "maxWorkers": 1}},
    }


@pytest.fixture(scope="module")
def server(model_store: Path) -> Iterator[LiveServer]:
    live = LiveServer(make_config(model_store, models=_models())).start()
    yield live
    live.stop()


@pytest.fixture(autouse=True)
def _pressed_while_testing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "PRESSURE_S", float(WAIT_S * 10))


def _press(server: LiveServer) -> None:
    """A refusal now (by either path): ``idle`` is pressed for the next PRESSURE_S; each refusal
    after it renews that."""
    refused = httpx.post(f"{server.url}/predictions/idle", content=b"{}", timeout=WAIT_S)
    assert refused.status_code == 503, refused.text
    registry = server.server.registry
    assert registry is not None and registry.resolve("idle").admission.pressed


def _scope(path: str, method: str = "POST") -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(b"content-type", b"application/json")],
        "query_string": b"",
        "client": ("127.0.0.1", 1),
        "http_version": "1.1",
    }


def test_at_headers_refuses_only_a_pressed_model_that_refuses(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    _press(server)
    registry = server.server.registry
    assert registry is not None
    assert not registry.resolve("live").admission.pressed
    app = InferenceApp(DataPlane(registry, server_version="t"), max_request_size=1 << 20)
    status, headers, body = app.at_headers(_scope("/predictions/idle"))  # type: ignore[misc]
    assert status == 503
    assert (b"content-type", b"application/json") in headers
    assert (b"content-length", str(len(body)).encode()) in headers
    assert b'"type":"NoWorker"' in body
    oip = app.at_headers(_scope("/v2/models/idle/infer"))
    assert oip is not None and oip[2].startswith(b'{"error":')
    # Served, unknown, not an inference route, or a key refused: the ASGI path answers.
    scope = _scope("/predictions/live")
    assert app.at_headers(scope) is None
    assert scope[early.ROUTED][0].endpoint == "predict"  # routed once, for __call__
    assert app.at_headers(_scope("/predictions/nope")) is None
    assert app.at_headers(_scope("/v2/health/live", "GET")) is None
    assert app.at_headers(_scope("/no/such/route")) is None

    def refuse_key(scope: Any, api: str) -> None:
        raise Unauthorized("Token Authorization failed")

    keyed = InferenceApp(
        DataPlane(registry, server_version="t"), max_request_size=1, authorize=refuse_key
    )
    assert keyed.at_headers(_scope("/predictions/idle")) is None  # the ASGI path's 401

    def broken(scope: Any, api: str) -> None:
        raise RuntimeError("a bug")

    buggy = InferenceApp(
        DataPlane(registry, server_version="t"), max_request_size=1, authorize=broken
    )
    with caplog.at_level(logging.ERROR, logger="torchbay.http"):
        assert buggy.at_headers(_scope("/predictions/idle")) is None  # never a 400 from the parser
    assert "from its headers failed" in caplog.text


def _read_response(sock: socket.socket, buffer: bytearray) -> tuple[bytes, bytes]:
    """One content-length response off ``sock`` (head, body); what follows stays in buffer."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {bytes(buffer)!r}"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    buffer[:] = rest[length:]
    return head, rest[:length]


def _without_date(head: bytes) -> list[bytes]:
    return [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]


def _post(path: str, extra: str = "", version: str = "1.1") -> bytes:
    return (
        f"POST {path} HTTP/{version}\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {len(BODY)}\r\n{extra}\r\n"
    ).encode() + BODY


def _requests_5xx(server: LiveServer) -> float:
    scrape = httpx.get(f"{server.metrics_url}/metrics", timeout=WAIT_S).text
    return next(
        s.value
        for family in text_string_to_metric_families(scrape)
        if family.name == "Requests5XX"
        for s in family.samples
    )


def test_refusals_from_the_headers_on_the_wire(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    port = server.server.state.ports.inference
    before = _requests_5xx(server) + 1  # and _press's refusal
    # The server records a request (its metrics, then its access line) in a callback after the
    # answer (observe.logs.Deferred), so an earlier test's last line (its _press) can come after
    # this test began on a loaded host; the scrape above is answered after every such callback
    # has run, so from here on only this test's requests are logged.
    caplog.clear()
    _press(server)
    for path in PATHS:
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
            buffer = bytearray()
            # HTTP/1.0 closes after its answer: the ASGI path answers it (the reference).
            sock.sendall(_post(path, version="1.0"))
            reference, reference_body = _read_response(sock, buffer)
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
            buffer = bytearray()
            # Keep-alive, with a request pipelined behind the refused one's body.
            live = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"
            sock.sendall(_post(path) + live + _post(path))
            head, body = _read_response(sock, buffer)
            assert head.startswith(b"HTTP/1.1 503 "), head
            assert body == reference_body
            expected = [line for line in _without_date(reference) if line != b"connection: close"]
            assert _without_date(head) == expected
            head, body = _read_response(sock, buffer)  # the body was skipped, not parsed
            assert head.startswith(b"HTTP/1.1 200 ") and body == b'{"live":true}'
            head, body = _read_response(sock, buffer)
            assert head.startswith(b"HTTP/1.1 503 ") and body == reference_body
    refusals = 3 * len(PATHS)
    assert _requests_5xx(server) - before == refusals  # counted as the ASGI path counts
    lines = [dict(zip(ACCESS_FIELDS, r.args, strict=True)) for r in caplog.records  # type: ignore[arg-type]
             if r.name == ACCESS_LOGGER]  # fmt: skip
    refused = [f for f in lines if f["status"] == 503 and f["model"] == "idle"]
    assert len(refused) == refusals + 1


def test_a_refusal_from_the_headers_leaves_no_garbage(server: LiveServer) -> None:
    """Each refusal is freed when answered. A refusal whose error kept its traceback made a
    reference cycle (the error, its frames, the caller holding the error) per request: under
    overload a garbage collection every few dozen refusals, about 35 us of frontend CPU each
    (benchmarks/RESULTS.md, "Refusals and the garbage collector")."""
    port = server.server.state.ports.inference
    _press(server)
    connection = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    with errors_left_in_cycles() as left, connection as sock:
        buffer = bytearray()
        for path in PATHS * 10:
            sock.sendall(_post(path))
            head, _body = _read_response(sock, buffer)
            assert head.startswith(b"HTTP/1.1 503 "), head
    assert left == [], f"{len(left)} refusals left in reference cycles, e.g. {left[0]!r}"


def test_a_client_waiting_for_100_continue_gets_the_asgi_paths_close(server: LiveServer) -> None:
    port = server.server.state.ports.inference
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        head = _post("/predictions/idle", "Expect: 100-continue\r\n")[: -len(BODY)]
        sock.sendall(head)  # no body: it waits to be told to send it
        buffer = bytearray()
        answer, _ = _read_response(sock, buffer)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"connection: close" in answer
        sock.settimeout(WAIT_S)
        assert sock.recv(1) == b""  # closed: what the client sends next cannot be framed


_SEGMENT = st.one_of(
    st.sampled_from(["idle", "live", "", "nope", "%69dle", "idle%2F1.0", "1.0", "infer"]),
    st.text(alphabet=st.characters(codec="latin-1", exclude_characters="/?#"), max_size=12),
)
_PATHS = st.builds(
    lambda head, segments: "/" + "/".join([head, *segments]),
    st.sampled_from(["predictions", "explanations", "v2", "v1", "ping", "models", ""]),
    st.lists(_SEGMENT, max_size=4),
) | st.builds(lambda m: f"/v1/models/{m}:predict", _SEGMENT)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(path=_PATHS, method=st.sampled_from(["POST", "GET", "PUT", "DELETE", "OPTIONS"]))
def test_at_headers_on_any_path_answers_a_503_or_nothing(
    server: LiveServer, path: str, method: str
) -> None:
    """Whatever the path (the protocol passes it decoded, as uvicorn does): a refusal with a
    JSON body, or None; never an exception (the catch-all would log it: checked below)."""
    registry = server.server.registry
    assert registry is not None
    registry.resolve("idle").admission.refused()  # pressed, whatever the time since
    app = InferenceApp(DataPlane(registry, server_version="t"), max_request_size=1 << 20)
    failures = []
    handler = logging.Handler()
    handler.emit = failures.append  # type: ignore[method-assign]
    logging.getLogger("torchbay.http").addHandler(handler)
    try:
        answer = app.at_headers(_scope(path, method))
    finally:
        logging.getLogger("torchbay.http").removeHandler(handler)
    assert not failures, [r.getMessage() for r in failures]
    if answer is not None:
        status, _headers, body = answer
        assert status == 503
        assert isinstance(json.loads(body), dict)


def test_a_head_refused_from_the_headers_sends_no_body(server: LiveServer) -> None:
    """HEAD /predictions runs the model as POST does (TorchServe checks no method), so a
    pressed model refuses it from the headers too: that answer wrote its body, which a client
    on the same connection reads as the start of the next answer."""
    port = server.server.state.ports.inference
    _press(server)
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(
            b"HEAD /predictions/idle HTTP/1.1\r\nHost: t\r\n\r\n"
            b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), raw
    assert rest.startswith(b"HTTP/1.1 200 ") and rest.endswith(b'{"live":true}'), raw
