"""The queue-time bound (``max_queue_delay_ms``) on a real server: real uvicorn, real workers
running the probe handler (``{"sleep": s}`` makes a batch slow), archives built by our archiver.

Queue times come from the server's own access log (``queue_ms``), never from wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from torchbay.server.config.sources import load_server_config
from torchbay.server.grpc import messages
from torchbay.server.observe.logs import ACCESS_FIELDS, ACCESS_LOGGER

from .conftest import ASSETS, LiveServer, build_store, errors_left_in_cycles, probe_models

pytestmark = pytest.mark.slow

SLOW = {"sleep": 0.05}  # one batch of the probe model: 50 ms
BURST = 40


def _slow_probe(bound_ms: float) -> dict[str, Any]:
    return probe_models(batchSize=1, minWorkers=1, maxWorkers=1, maxQueueDelayMs=bound_ms)


async def _burst(url: str, n: int, body: dict[str, Any]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        return list(await asyncio.gather(*(client.post(url, json=body) for _ in range(n))))


def _access(caplog: pytest.LogCaptureFixture, path: str) -> list[dict[str, Any]]:
    lines = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    fields = [dict(zip(ACCESS_FIELDS, r.args, strict=True)) for r in lines]  # type: ignore[arg-type]
    return [f for f in fields if f["path"] == path]


def _describe(server: LiveServer, name: str = "probe") -> dict[str, Any]:
    response = httpx.get(f"{server.management_url}/models/{name}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()[0]


def _check_refusal(response: httpx.Response) -> None:
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1  # RFC 9110: whole seconds
    body = response.json()
    assert body["code"] == 503 and body["type"] in ("Overloaded", "QueueFull"), body


def _check_burst(
    server: LiveServer,
    responses: list[httpx.Response],
    caplog: pytest.LogCaptureFixture,
    bound_ms: float,
    sent: int,
) -> list[int]:
    """Every request answered exactly once (one access line each); each 503 says when to retry;
    each 200 waited in the queue within the bound (the server's own queue time)."""
    server.recorded()  # the last answers' access lines too
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503}, statuses
    for response in responses:
        if response.status_code == 503:
            _check_refusal(response)
    lines = _access(caplog, "/predictions/probe")
    assert len(lines) == sent
    served = [f for f in lines if f["status"] == 200]
    assert len(served) == statuses.count(200) + (sent - len(responses))
    for line in served:
        assert line["queue_ms"] is not None and line["queue_ms"] <= bound_ms, line
    return statuses


def test_overload_is_refused_at_once_and_the_admitted_meet_the_bound(
    live_server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    server = live_server(models=_slow_probe(200))
    url = f"{server.url}/predictions/probe"
    for _ in range(3):  # measured batches: the service rate is known
        assert httpx.post(url, json=SLOW, timeout=60).status_code == 200
    rate = _describe(server)["serviceRatePerWorker"]
    assert rate is not None and rate > 0
    statuses = _check_burst(server, asyncio.run(_burst(url, BURST, SLOW)), caplog, 200, BURST + 3)
    assert statuses.count(503) >= 1  # 2 s of work offered at once, 0.2 s admitted
    assert statuses.count(200) >= 1
    described = _describe(server)
    assert described["maxQueueDelayMs"] == 200
    refused = described["admissionRejections"]
    assert refused["predicted_wait"] >= 1
    assert sum(refused.values()) == statuses.count(503)
    scrape = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    samples = {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(scrape)
        if family.name == "torchbay_admission_rejections"
        for s in family.samples
        if s.name.endswith("_total") and s.labels.get("model") == "probe"
    }
    assert samples == {k: float(v) for k, v in refused.items()}


def test_a_cold_burst_is_bounded_at_dispatch(live_server, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing measured yet: admitted by queue length only, then answered 503 (never run) once
    queued past the bound."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    server = live_server(models=_slow_probe(200))
    url = f"{server.url}/predictions/probe"
    statuses = _check_burst(server, asyncio.run(_burst(url, BURST, SLOW)), caplog, 200, BURST)
    assert statuses.count(503) >= 1 and statuses.count(200) >= 1
    refused = _describe(server)["admissionRejections"]
    assert refused["queue_full"] == 0
    assert refused["expired"] + refused["predicted_wait"] == statuses.count(503)


def _grpc_burst(server: LiveServer, n: int, body: dict[str, Any]) -> list[str]:
    """``n`` TorchServe gRPC Predictions at once; each call's status code name."""
    service = messages.TS_INFERENCE_SERVICE
    request_type, response_type, *_ = messages.method_types(service, "Predictions")
    request = request_type(model_name="probe", input={"body": json.dumps(body).encode()})

    async def burst() -> list[str]:
        target = f"127.0.0.1:{server.server.state.ports.grpc_inference}"
        async with grpc.aio.insecure_channel(target) as channel:
            predict = channel.unary_unary(
                f"/{service}/Predictions",
                request_serializer=request_type.SerializeToString,
                response_deserializer=response_type.FromString,
            )

            async def one() -> str:
                try:
                    await predict(request, timeout=60)
                except grpc.aio.AioRpcError as error:
                    return error.code().name
                return "OK"

            return list(await asyncio.gather(*(one() for _ in range(n))))

    return asyncio.run(burst())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_expired_request_leaves_no_garbage(live_server, protocol: str) -> None:
    """A request answered 503 after waiting past the bound is freed with its answer. Its error
    used to stay in a reference cycle (the error's frames held the request's future, which held
    the error), left to the garbage collector: a collection every few dozen such answers under
    overload (benchmarks/RESULTS.md, "Refusals and the garbage collector")."""
    server = live_server(models=_slow_probe(200))
    with errors_left_in_cycles() as left:
        if protocol == "http":
            url = f"{server.url}/predictions/probe"
            codes = [r.status_code for r in asyncio.run(_burst(url, BURST, SLOW))]
            refused = codes.count(503)
        else:
            refused = _grpc_burst(server, BURST, SLOW).count("UNAVAILABLE")
        server.recorded()
    expired = _describe(server)["admissionRejections"]["expired"]
    assert refused >= expired >= 1  # a cold burst: admitted by queue length, then expired
    assert left == [], f"{len(left)} answered errors left in reference cycles: {left[0]!r}"


def test_bound_zero_keeps_the_old_behaviour(live_server, caplog) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    server = live_server(models=_slow_probe(0))
    url = f"{server.url}/predictions/probe"
    httpx.post(url, json={"sleep": 0.02}, timeout=60)
    responses = asyncio.run(_burst(url, BURST, {"sleep": 0.02}))
    assert [r.status_code for r in responses] == [200] * BURST
    assert _describe(server)["admissionRejections"] == {
        "predicted_wait": 0,
        "expired": 0,
        "queue_full": 0,
    }


# -- a refusal before the body ---------------------------------------------------------------


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a content-length body, read off ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    headers = {k.lower(): v for k, v in headers.items()}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    assert len(rest) == length, "more than one response arrived"
    return int(lines[0].split()[1]), headers, rest


def _head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _connect(server: LiveServer) -> socket.socket:
    port = server.server.state.ports.inference
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return sock


def test_a_refusal_needs_no_body_and_keeps_the_connection_right(live_server) -> None:
    server = live_server(models=_slow_probe(100))
    url = f"{server.url}/predictions/probe"
    for _ in range(2):  # 2 requests per second: one running is ~250 ms of work ahead, > 100
        assert httpx.post(url, json={"sleep": 0.5}, timeout=60).status_code == 200
    long = threading.Thread(
        target=lambda: httpx.post(url, json={"sleep": 3}, timeout=60), daemon=True
    )
    long.start()
    registry = server.server.registry
    assert registry is not None
    mv = registry.resolve("probe", None)
    deadline = time.monotonic() + 30
    while not (mv.inflight >= 1 and len(mv.queue) == 0) and time.monotonic() < deadline:
        time.sleep(0.01)  # poll, bounded: the long request is running
    assert mv.inflight >= 1
    size = 48 * 1024
    for path in ("/predictions/probe", "/v2/models/probe/infer", "/v1/models/probe:predict"):
        # Headers and a sliver of the body, then the client stalls: the 503 still arrives.
        with _connect(server) as stalled:
            stalled.sendall(_head(path, size) + b"x" * 100)
            status, headers, body = _read_response(stalled)
            assert status == 503, body
            assert int(headers["retry-after"]) >= 1
            data = json.loads(body)  # TorchServe's error body, or OIP's {"error"}
            assert data.get("type") == "Overloaded" or "overloaded" in data["error"], data
    # A keep-alive client sends its whole body: the answer, then its next request is served.
    with _connect(server) as client:
        client.sendall(_head("/predictions/probe", size) + b"x" * size)
        status, headers, _ = _read_response(client)
        assert status == 503 and int(headers["retry-after"]) >= 1
        client.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        status, _, body = _read_response(client)
        assert status == 200 and json.loads(body) == {"live": True}
    _check_grpc_refusal(server)
    long.join(60)


def _check_grpc_refusal(server: LiveServer) -> None:
    """The same refusal over TorchServe's gRPC Predictions: UNAVAILABLE, retry-after in the
    trailing metadata."""
    service = messages.TS_INFERENCE_SERVICE
    request_type, response_type, *_ = messages.method_types(service, "Predictions")
    with grpc.insecure_channel(f"127.0.0.1:{server.server.state.ports.grpc_inference}") as channel:
        predict = channel.unary_unary(
            f"/{service}/Predictions",
            request_serializer=request_type.SerializeToString,
            response_deserializer=response_type.FromString,
        )
        request = request_type(model_name="probe", input={"data": b'{"echo": 1}'})
        with pytest.raises(grpc.RpcError) as refused:
            predict(request, timeout=30)
    error = refused.value
    assert error.code() is grpc.StatusCode.UNAVAILABLE, error.details()
    trailing = dict(error.trailing_metadata() or ())
    assert int(trailing["retry-after"]) >= 1


# -- live changes and configuration sources --------------------------------------------------


def test_the_management_api_sets_the_bound_live(live_server) -> None:
    server = live_server(models=_slow_probe(0))
    api = f"{server.management_url}/models/probe"
    assert _describe(server)["maxQueueDelayMs"] == 0
    response = httpx.put(
        api, params={"max_queue_delay_ms": "150", "synchronous": "true"}, timeout=30
    )
    assert response.status_code == 200, response.text
    assert _describe(server)["maxQueueDelayMs"] == 150
    registry = server.server.registry
    assert registry is not None
    assert registry.resolve("probe", None).queue.max_wait_s == pytest.approx(0.15)
    for bad in ("-5", "soon"):
        response = httpx.put(
            api, params={"max_queue_delay_ms": bad, "synchronous": "true"}, timeout=30
        )
        assert response.status_code == 400, response.text
        assert "max_queue_delay_ms" in response.json()["message"]
    assert _describe(server)["maxQueueDelayMs"] == 150
    assert (
        httpx.put(
            api, params={"max_queue_delay_ms": "0", "synchronous": "true"}, timeout=30
        ).status_code
        == 200
    )
    assert _describe(server)["maxQueueDelayMs"] == 0


def test_register_takes_the_bound_and_the_sla_target(live_server) -> None:
    """POST /models takes torchbay's max_queue_delay_ms and sla_p99_ms beside TorchServe's
    parameters; a value that is not a number, or negative, is a 400 and registers nothing."""
    server = live_server(enable_model_api=True)
    api = f"{server.management_url}/models"
    base = {"url": "tiny.mar", "initial_workers": "1", "synchronous": "true"}
    for name, bad in (("soon", {"max_queue_delay_ms": "soon"}), ("neg", {"sla_p99_ms": "-1"})):
        response = httpx.post(api, params={**base, "model_name": name, **bad}, timeout=60)
        assert response.status_code == 400, response.text
        assert next(iter(bad)) in response.json()["message"]
        assert httpx.get(f"{api}/{name}", timeout=10).status_code == 404
    params = {**base, "model_name": "reg", "max_queue_delay_ms": "175", "sla_p99_ms": "80"}
    response = httpx.post(api, params=params, timeout=60)
    assert response.status_code == 200, response.text
    described = _describe(server, "reg")
    assert described["maxQueueDelayMs"] == 175
    assert described["autopilot"]["targetP99Ms"] == 80
    registry = server.server.registry
    assert registry is not None
    assert registry.resolve("reg", None).queue.max_wait_s == pytest.approx(0.175)


@pytest.fixture(scope="module")
def bound_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """probe.mar, tiny.mar, and yamlq.mar whose model-config.yaml sets maxQueueDelayMs 300 and
    the autopilot's slaP99Ms 90."""
    config = tmp_path_factory.mktemp("bound-config") / "model-config.yaml"
    config.write_text("maxQueueDelayMs: 300\nslaP99Ms: 90\n")
    handlers = {"probe": str(ASSETS / "probe_handler.py"), "tiny": "tensor", "yamlq": "tensor"}
    return build_store(tmp_path_factory, "bound-store", handlers, {"yamlq": config})


def test_every_config_source_reaches_the_model(bound_store: Path, tmp_path: Path) -> None:
    """config.properties' max_queue_delay_ms is every model's default; the models JSON's
    maxQueueDelayMs and an archive's model-config.yaml set one model's."""
    models = {
        "probe": {"1.0": {"marName": "probe.mar", "maxQueueDelayMs": 120}},
        "tiny": {"1.0": {"marName": "tiny.mar"}},
        "yamlq": {"1.0": {"marName": "yamlq.mar"}},
    }
    properties = tmp_path / "config.properties"
    properties.write_text(
        f"model_store={bound_store}\n"
        "inference_address=http://127.0.0.1:0\n"
        "management_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\n"
        "grpc_inference_port=0\n"
        "grpc_management_port=0\n"
        "disable_token_authorization=true\n"
        "max_queue_delay_ms=250\n"
        f"models={json.dumps(models)}\n"
    )
    config, _ = load_server_config(ts_config=properties, env={}, cli={}, cwd=tmp_path)
    server = LiveServer(config).start()
    try:
        described = {name: _describe(server, name) for name in models}
    finally:
        server.stop()
    bounds = {name: d["maxQueueDelayMs"] for name, d in described.items()}
    assert bounds == {"probe": 120, "tiny": 250, "yamlq": 300}
    targets = {name: (d["autopilot"] or {}).get("targetP99Ms") for name, d in described.items()}
    assert targets == {"probe": None, "tiny": None, "yamlq": 90}
