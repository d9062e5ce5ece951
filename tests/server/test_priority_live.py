"""Priorities and timeouts on a live server, for every protocol: OIP REST (tritonclient's http
``priority=`` / ``timeout=``, and httpx), OIP gRPC (tritonclient's grpc), TorchServe REST (the
``X-Torchbay-Priority`` / ``X-Torchbay-Timeout-Us`` headers) and TorchServe gRPC (the same
names as call metadata). Real uvicorn, grpcio, worker processes and archives.

The order is proven by construction (tests/server/assets/gate_handler.py): a first request holds
the one worker until the test creates its gate file, so every later request is queued; the
handler logs the ids it runs, in order. A request's timeout is known to have passed by reading
its 503 coming while the worker is still held, never by sleeping."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from .conftest import ASSETS, LiveServer, build_store, ran_ids, running, until

pytestmark = pytest.mark.slow

GATE = {
    "marName": "gate.mar",
    "batchSize": 1,
    "minWorkers": 1,
    "maxWorkers": 1,
    "priorityLevels": 2,
    "defaultPriorityLevel": 2,
    # Requests may shorten the level's timeout (a minute) to their own.
    "defaultQueuePolicy": {"defaultTimeoutMicroseconds": 60_000_000, "allowTimeoutOverride": True},
}
# Triton's form (model_config.proto's names, as protobuf's JSON writes a uint64: text) in the
# archive's model-config.yaml.
TRITON_YAML = """minWorkers: 1
maxWorkers: 1
dynamic_batching:
  max_queue_delay_microseconds: 2000
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy: {timeout_action: DELAY, default_timeout_microseconds: "7000"}
  priority_queue_policy:
    "1": {max_queue_size: 4}
"""
APIS = ("oip_rest", "oip_grpc", "ts_rest", "ts_grpc")
GRPC_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNAVAILABLE: 503,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    triton_yaml = tmp_path_factory.mktemp("prio-config") / "model-config.yaml"
    triton_yaml.write_text(TRITON_YAML)
    handler = str(ASSETS / "gate_handler.py")
    store = build_store(
        tmp_path_factory, "prio-store", {"gate": handler, "tri": handler}, {"tri": triton_yaml}
    )
    with running(store, models={"gate": {"1.0": GATE}}, load_models=["all"]) as live:
        yield live


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8) as executor:
        yield executor


def _http_port(server: LiveServer) -> str:
    return server.url.removeprefix("http://")


def _oip_rest(server: LiveServer, body: dict, priority: int, timeout: int | None) -> Any:
    client = triton_http.InferenceServerClient(_http_port(server), network_timeout=60)
    text = triton_http.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=object))
    try:
        client.infer("gate", [text], priority=priority, timeout=timeout)
    except InferenceServerException as exc:
        return int(exc.status()), exc.message()
    return 200, ""


def _oip_grpc(server: LiveServer, body: dict, priority: int, timeout: int | None) -> Any:
    port = server.server.state.ports.grpc_inference
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=object))
    try:
        client.infer("gate", [text], priority=priority, timeout=timeout, client_timeout=60)
    except InferenceServerException as exc:
        code = next(c for c in grpc.StatusCode if str(c) == exc.status())
        return GRPC_STATUS.get(code, 500), exc.message()
    return 200, ""


def _headers(priority: int | str, timeout: int | str | None) -> dict[str, str]:
    headers = {"x-torchbay-priority": str(priority)}
    if timeout is not None:
        headers["x-torchbay-timeout-us"] = str(timeout)
    return headers


def _ts_rest(server: LiveServer, body: dict, priority: Any, timeout: Any) -> Any:
    url = f"{server.url}/predictions/gate"
    response = httpx.post(url, json=body, headers=_headers(priority, timeout), timeout=60)
    return response.status_code, response.text


def _ts_grpc(server: LiveServer, body: dict, priority: Any, timeout: Any, ts: Any) -> Any:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.server.state.ports.grpc_inference}")
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    request = ts.inference_pb2.PredictionsRequest(
        model_name="gate", input={"data": json.dumps(body).encode()}
    )
    metadata = tuple(_headers(priority, timeout).items())
    try:
        stub.Predictions(request, metadata=metadata, timeout=60)
    except grpc.RpcError as exc:
        return GRPC_STATUS.get(exc.code(), 500), exc.details()
    return 200, ""


def _sender(server: LiveServer, ts: SimpleNamespace, api: str) -> Callable[..., Any]:
    """``send(body, priority, timeout_us) -> (status, message)`` over ``api`` (gRPC codes as
    the HTTP statuses they stand for)."""
    if api == "ts_grpc":
        return lambda body, priority=0, timeout=None: _ts_grpc(server, body, priority, timeout, ts)
    fn = {"oip_rest": _oip_rest, "oip_grpc": _oip_grpc, "ts_rest": _ts_rest}[api]
    return lambda body, priority=0, timeout=None: fn(server, body, priority, timeout)


def _queue(server: LiveServer) -> Any:
    return server.server.registry.resolve("gate").queue


def _hold(pool: ThreadPoolExecutor, server: LiveServer, tmp_path: Path) -> tuple[Any, Path, Path]:
    """A request ("held") running on the worker until the gate opens; its answer, log, gate."""
    log, gate = tmp_path / "ran.log", tmp_path / "gate"
    held = pool.submit(
        _ts_rest, server, {"id": "held", "log": str(log), "gate": str(gate)}, 0, None
    )
    until(lambda: ran_ids(log) == ["held"], "the held request runs")
    return held, log, gate


@pytest.fixture(params=APIS)
def gated(
    request: pytest.FixtureRequest,
    server: LiveServer,
    ts_stubs: SimpleNamespace,
    pool: ThreadPoolExecutor,
    tmp_path: Path,
) -> SimpleNamespace:
    """For each API: its ``send``, and a request (``held``) running on the worker until the
    ``gate`` opens, with the handler's ``log``."""
    held, log, gate = _hold(pool, server, tmp_path)
    send = _sender(server, ts_stubs, request.param)
    return SimpleNamespace(api=request.param, send=send, held=held, log=log, gate=gate)


def test_high_priority_overtakes_queued_low_ones(
    server: LiveServer, pool: ThreadPoolExecutor, gated: SimpleNamespace
) -> None:
    send, log, gate = gated.send, gated.log, gated.gate
    low = []
    for i in range(2):  # one after the other: their arrival order is known
        low.append(pool.submit(send, {"id": f"low{i}", "log": str(log)}, 2))
        until(lambda n=i + 1: len(_queue(server)) == n, f"low-priority request {i} queued")
    high = pool.submit(send, {"id": "high", "log": str(log)}, 1)
    until(lambda: len(_queue(server)) == 3, "the high-priority request queued")
    gate.touch()
    assert [f.result(60)[0] for f in (gated.held, high, *low)] == [200] * 4
    assert ran_ids(log) == ["held", "high", "low0", "low1"]


def test_a_priority_past_the_levels_runs_at_the_default_level(
    server: LiveServer, pool: ThreadPoolExecutor, gated: SimpleNamespace
) -> None:
    """Triton's SetPriority: a priority above the model's priority_levels is its default level
    (here 2), not a 400 (it was one); past any model's levels (16) it is still refused."""
    send, log, gate = gated.send, gated.log, gated.gate
    low = pool.submit(send, {"id": "low", "log": str(log)}, 2)
    until(lambda: len(_queue(server)) == 1, "the level-2 request queued")
    past = pool.submit(send, {"id": "past", "log": str(log)}, 3)
    try:
        until(lambda: past.done() or len(_queue(server)) == 2, "the priority-3 request queued")
        assert not past.done(), past.result()  # queued, not refused
        high = pool.submit(send, {"id": "high", "log": str(log)}, 1)
        until(lambda: len(_queue(server)) == 3, "the high-priority request queued")
    finally:
        gate.touch()
    assert [f.result(60)[0] for f in (gated.held, low, past, high)] == [200] * 4
    assert ran_ids(log) == ["held", "high", "low", "past"]  # behind level 2's earlier one


def test_a_request_past_its_timeout_is_answered_503_and_never_runs(
    server: LiveServer, pool: ThreadPoolExecutor, gated: SimpleNamespace
) -> None:
    """Triton's REJECT answers UNAVAILABLE "Request timeout expired" (its
    qa/L0_batcher/queue_timeout_test.py); it was a 504 / DEADLINE_EXCEEDED."""
    send, log, gate = gated.send, gated.log, gated.gate
    late = pool.submit(send, {"id": "late", "log": str(log)}, 0, 1000)  # 1 ms
    # Answered at its own 1 ms (not the level's minute), while the worker is still busy.
    status, message = late.result(30)
    gate.touch()
    assert status == 503, message
    if gated.api.startswith("oip"):
        assert "Request timeout expired" in message  # Triton's words
    assert gated.held.result(60)[0] == 200
    assert ran_ids(log) == ["held"]  # the worker never saw it


@pytest.mark.parametrize(
    ("api", "priority", "timeout", "field"),
    [
        ("oip_rest", 17, None, "priority"),
        ("oip_grpc", 17, None, "priority"),
        ("ts_rest", "high", None, "X-Torchbay-Priority"),
        ("ts_rest", 1, -5, "X-Torchbay-Timeout-Us"),
        ("ts_grpc", 99, None, "X-Torchbay-Priority"),
    ],
)
def test_bad_schedule_values_are_400s_naming_the_field(
    server: LiveServer,
    ts_stubs: SimpleNamespace,
    api: str,
    priority: Any,
    timeout: Any,
    field: str,
) -> None:
    status, message = _sender(server, ts_stubs, api)(
        {"id": "x", "log": "/dev/null"}, priority, timeout
    )
    assert status == 400, message
    assert field in message
    assert "Traceback" not in message and "/" not in message.split(field)[0]


def test_oip_negative_timeout_is_a_400_naming_it(server: LiveServer) -> None:
    body = {"parameters": {"timeout": -1}, "inputs": []}
    response = httpx.post(f"{server.url}/v2/models/gate/infer", json=body, timeout=60)
    assert response.status_code == 400
    assert "timeout: must be an integer from 0" in response.json()["error"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_a_compressed_oip_request_s_schedule_is_read(server: LiveServer, algorithm: str) -> None:
    """tritonclient compresses the body when asked; its priority is read all the same (it was
    ignored: the plane looked for it in the compressed bytes)."""
    client = triton_http.InferenceServerClient(_http_port(server), network_timeout=60)
    text = triton_http.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b'{"id": "z", "log": "/dev/null"}'], dtype=object))
    with pytest.raises(InferenceServerException) as err:
        client.infer("gate", [text], priority=17, request_compression_algorithm=algorithm)
    assert err.value.status() == "400" and "priority" in err.value.message()


def test_model_config_shows_the_levels_and_policies(server: LiveServer) -> None:
    config = httpx.get(f"{server.url}/v2/models/gate/config", timeout=30).json()
    batching = config["dynamic_batching"]
    assert batching["priority_levels"] == 2 and batching["default_priority_level"] == 2
    assert batching["default_queue_policy"] == {
        "timeout_action": "REJECT",
        "default_timeout_microseconds": 60_000_000,
        "allow_timeout_override": True,
        "max_queue_size": 100,
    }
    assert "schedule_policy" in httpx.get(f"{server.url}/v2", timeout=30).json()["extensions"]
    described = httpx.get(f"{server.management_url}/models/gate", timeout=30).json()[0]
    assert [level["level"] for level in described["queueLevels"]] == [1, 2]


def test_a_triton_dynamic_batching_section_sets_the_levels_and_policies(
    server: LiveServer,
) -> None:
    """A model-config.yaml's Triton-form ``dynamic_batching`` section sets the levels, the
    queue policies and the batch delay, as its ``sequence_batching`` sets the sequence
    settings; it was left to the handler alone, and the model had no levels."""
    described = httpx.get(f"{server.management_url}/models/tri", timeout=30).json()[0]
    levels = [
        (lv["level"], lv["maxQueueSize"], lv["defaultTimeoutMicroseconds"], lv["timeoutAction"])
        for lv in described.get("queueLevels", [])
    ]
    assert levels == [(1, 4, 0, "REJECT"), (2, 0, 7000, "DELAY")], described
    assert described["maxBatchDelay"] == 2, described


def _per_level(server: LiveServer) -> tuple[dict[tuple, float], list[dict]]:
    """The gate model's per-level samples of /metrics ({(name, level, code): value}; code None
    for the depth) and describe's ``queueLevels``."""
    port = server.server.state.ports.metrics
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("model") != "gate":
                continue
            if sample.name == "torchbay_queue_depth":
                assert set(labels) == {"model", "version"}  # unchanged: no level
            if sample.name.startswith("torchbay_priority_"):
                key = (sample.name, int(labels["level"]), labels.get("code", labels.get("action")))
                samples[key] = sample.value
    described = httpx.get(f"{server.management_url}/models/gate", timeout=30).json()[0]
    return samples, described["queueLevels"]


def _depth(level: int) -> tuple:
    return ("torchbay_priority_queue_depth", level, None)


def _requests(level: int, code: int) -> tuple:
    return ("torchbay_priority_requests_total", level, str(code))


def test_metrics_and_describe_count_each_level(
    server: LiveServer, pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    before, _ = _per_level(server)
    held, log, gate = _hold(pool, server, tmp_path)  # level 2 (the default)
    low = [
        pool.submit(_ts_rest, server, {"id": f"low{i}", "log": str(log)}, 2, None) for i in (0, 1)
    ]
    high = pool.submit(_ts_rest, server, {"id": "high", "log": str(log)}, 1, None)
    until(lambda: len(_queue(server)) == 3, "three requests queued")
    samples, levels = _per_level(server)
    assert (samples[_depth(1)], samples[_depth(2)]) == (1.0, 2.0)
    assert [(lv["level"], lv["queued"]) for lv in levels] == [(1, 1), (2, 2)]
    late = pool.submit(_ts_rest, server, {"id": "late", "log": str(log)}, 1, 1000)  # 1 ms
    assert late.result(30)[0] == 503  # answered at its timeout, the worker still busy
    samples, levels = _per_level(server)  # and no longer counted as queued
    assert (samples[_depth(1)], samples[_depth(2)]) == (1.0, 2.0)
    gate.touch()
    assert [f.result(60)[0] for f in (held, high, *low)] == [200, 200, 200, 200]
    counted = before.get(_requests(2, 200), 0) + 3  # the exchanges count as they close
    until(lambda: _per_level(server)[0].get(_requests(2, 200)) == counted, "level 2's counted")
    after, levels = _per_level(server)
    for level, code, count in ((1, 200, 1), (1, 503, 1), (2, 200, 3)):
        key = _requests(level, code)
        assert after[key] - before.get(key, 0) == count, key
    # The 503 that was the level's timeout, told apart from a refusal's (Triton's REJECTED).
    expired = ("torchbay_priority_timeouts_total", 1, "REJECT")
    assert after[expired] - before.get(expired, 0) == 1
    assert (after[_depth(1)], after[_depth(2)]) == (0.0, 0.0)
    assert levels[0]["requests"]["503"] >= 1 and levels[1]["requests"]["200"] >= 3
    assert levels[0]["timeouts"]["REJECT"] >= 1
