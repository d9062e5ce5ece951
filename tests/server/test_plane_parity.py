"""One data plane under every protocol: each operation driven over HTTP and over gRPC, with the
real clients Triton and TorchServe users have (tritonclient.http and .grpc, TorchServe's gRPC
management stubs), has the same effect: the same counters move in ``/metrics`` and in the
statistics extension, the same model state, the same error class.

Among them, the regressions of issue 27's three bugs: a gRPC ``ModelInfer`` is counted in the
statistics; gRPC ``ServerMetadata`` advertises only extensions whose RPCs it serves (and it
serves them all); ``/v2/health/ready`` and gRPC ``ServerReady`` are true with no model loaded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from torchbay.server.grpc import messages

from .conftest import LiveServer, running

pytestmark = pytest.mark.slow

PROTOCOLS = ("http", "grpc")
# Each advertised extension and an RPC of it that must not answer UNIMPLEMENTED.
EXTENSION_RPCS = {
    "model_configuration": ["ModelConfig"],
    "statistics": ["ModelStatistics"],
    "model_repository": ["RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"],
    "binary_tensor_data": ["ModelInfer"],
    "classification": ["ModelInfer"],
    "sequence": ["ModelInfer"],
    "schedule_policy": ["ModelInfer"],
    "logging": ["LogSettings"],
    "trace": ["TraceSetting"],
}


@pytest.fixture(scope="module")
def server(oip_store: Path) -> Iterator[LiveServer]:
    with running(oip_store, load_models=["one.mar"], enable_model_api=True) as live:
        yield live


@pytest.fixture(scope="module")
def clients(server: LiveServer) -> Iterator[dict[str, Any]]:
    ports = server.server.state.ports
    both = {
        "http": triton_http.InferenceServerClient(f"127.0.0.1:{ports.inference}"),
        "grpc": triton_grpc.InferenceServerClient(f"127.0.0.1:{ports.grpc_inference}"),
    }
    yield both
    for client in both.values():
        client.close()


def _module(protocol: str) -> Any:
    return triton_http if protocol == "http" else triton_grpc


def _stats(client: Any, protocol: str, name: str = "one") -> dict[str, int]:
    """The counters of ``name`` from the statistics extension, read over ``protocol``."""
    if protocol == "http":
        body = client.get_inference_statistics(name)
    else:
        body = client.get_inference_statistics(name, as_json=True)
    (entry,) = body["model_stats"]
    inference = entry["inference_stats"]
    return {  # gRPC's JSON writes int64 as strings, and leaves zeros out
        "success": int(inference.get("success", {}).get("count", 0)),
        "fail": int(inference.get("fail", {}).get("count", 0)),
        "queue": int(inference.get("queue", {}).get("count", 0)),
        "inference_count": int(entry.get("inference_count", 0)),
    }


def _metrics(server: LiveServer) -> dict[str, float]:
    """``torchbay_requests_total`` by code and ``ts_inference_requests_total`` for model one."""
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "torchbay_requests_total" and labels.get("model") == "one":
                out[f"code {labels['code']}"] = sample.value
            if sample.name == "ts_inference_requests_total" and labels.get("model_name") == "one":
                out["ts"] = sample.value
    return out


def _infer(client: Any, protocol: str, model: str = "one") -> Any:
    module = _module(protocol)
    tensor = module.InferInput("input0", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 64), dtype=np.float32))
    return client.infer(model, [tensor])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_inference_moves_the_same_counters_over_either_protocol(
    server: LiveServer, clients: dict[str, Any], protocol: str
) -> None:
    client = clients[protocol]
    before, metrics_before = _stats(clients["http"], "http"), _metrics(server)
    result = _infer(client, protocol)
    assert result.as_numpy("output0").shape == (1, 10)
    after = _stats(clients["http"], "http")
    moved = {key: after[key] - before[key] for key in after}
    assert moved == {"success": 1, "fail": 0, "queue": 1, "inference_count": 1}
    assert _stats(client, protocol) == after  # the same statistics read over either protocol
    metrics = _metrics(server)
    assert metrics["code 200"] - metrics_before.get("code 200", 0) == 1
    assert metrics["ts"] - metrics_before.get("ts", 0) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_refused_inference_is_the_same_error_and_the_same_failure_count(
    server: LiveServer, clients: dict[str, Any], protocol: str
) -> None:
    client = clients[protocol]
    before = _stats(clients["http"], "http")
    module = _module(protocol)
    wrong = module.InferInput("input0", [1, 7], "FP32")  # the model takes [-1, 64]
    wrong.set_data_from_numpy(np.zeros((1, 7), dtype=np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("one", [wrong])
    expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert refused.value.status() == expected
    assert "input0" in refused.value.message()
    after = _stats(clients["http"], "http")
    moved = {key: after[key] - before[key] for key in after}
    # Refused in the worker, before the model: Triton counts a failure alone, no queue.
    assert moved == {"success": 0, "fail": 1, "queue": 0, "inference_count": 0}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_models_are_the_same_error_for_every_operation(
    clients: dict[str, Any], protocol: str
) -> None:
    client = clients[protocol]
    expected = "400" if protocol == "http" else "StatusCode.NOT_FOUND"
    calls = [
        lambda: client.get_model_metadata("nope"),
        lambda: client.get_model_config("nope"),
        lambda: client.get_inference_statistics("nope"),
        lambda: _infer(client, protocol, "nope"),
    ]
    for call in calls:
        with pytest.raises(InferenceServerException) as missing:
            call()
        # tritonclient.http reports the status of its own choosing for a 404 body; gRPC keeps it
        status = missing.value.status()
        assert status in (expected, "404"), (status, missing.value.message())
        # Triton's words, which scripts around Triton's clients match on
        assert missing.value.message().startswith("Request for unknown model: 'nope' is not found")


def test_torchserve_routes_keep_torchserves_words_for_the_same_error(server: LiveServer) -> None:
    """The error is one (the plane's ModelNotFound, 404); each protocol says it in its own words:
    TorchServe's on /predictions, Triton's on /v2."""
    ts = httpx.post(f"{server.url}/predictions/nope", content=b"{}", timeout=30)
    assert ts.status_code == 404 and ts.json()["message"] == "Model not found: nope"
    oip = httpx.post(f"{server.url}/v2/models/nope/infer", json={"inputs": []}, timeout=30)
    assert oip.status_code == 404
    assert oip.json() == {"error": "Request for unknown model: 'nope' is not found"}
    version = httpx.get(f"{server.url}/v2/models/one/versions/9/ready", timeout=30)
    assert version.json() == {"error": "Request for unknown model: 'one' version 9 is not found"}


def test_metadata_ready_and_config_are_the_same_over_either_protocol(
    clients: dict[str, Any],
) -> None:
    http, grpc_client = clients["http"], clients["grpc"]
    assert http.is_server_live() and grpc_client.is_server_live()
    assert http.is_server_ready() and grpc_client.is_server_ready()
    assert http.is_model_ready("one") and grpc_client.is_model_ready("one")
    meta_http = http.get_model_metadata("one")
    meta_grpc = grpc_client.get_model_metadata("one", as_json=True)
    assert meta_grpc["name"] == meta_http["name"] == "one"
    assert meta_grpc["platform"] == meta_http["platform"]
    for key in ("inputs", "outputs"):
        assert [
            (t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta_grpc[key]
        ] == [(t["name"], t["datatype"], t["shape"]) for t in meta_http[key]]
    config_http = http.get_model_config("one")
    config_grpc = grpc_client.get_model_config("one", as_json=True)["config"]
    assert config_grpc["name"] == config_http["name"]
    assert int(config_grpc["max_batch_size"]) == config_http["max_batch_size"]
    assert [(t["name"], t["data_type"]) for t in config_grpc["input"]] == [
        (t["name"], t["data_type"]) for t in config_http["input"]
    ]
    assert [int(d) for d in config_grpc["input"][0]["dims"]] == config_http["input"][0]["dims"]


def test_each_protocol_advertises_only_extensions_it_serves(
    server: LiveServer, clients: dict[str, Any]
) -> None:
    http_meta = clients["http"].get_server_metadata()
    grpc_meta = clients["grpc"].get_server_metadata(as_json=True)
    assert grpc_meta["extensions"] == http_meta["extensions"]
    assert {"statistics", "model_repository", "model_configuration"} <= set(grpc_meta["extensions"])
    channel = grpc.insecure_channel(f"127.0.0.1:{server.server.state.ports.grpc_inference}")
    try:
        for extension in grpc_meta["extensions"]:
            for rpc in EXTENSION_RPCS[extension]:
                request, response, _, _ = messages.method_types(messages.OIP_SERVICE, rpc)
                call = channel.unary_unary(
                    f"/{messages.OIP_SERVICE}/{rpc}",
                    request_serializer=request.SerializeToString,
                    response_deserializer=response.FromString,
                )
                try:
                    call(request(), timeout=30)
                except grpc.RpcError as exc:  # an empty request may be refused, never unserved
                    assert exc.code() != grpc.StatusCode.UNIMPLEMENTED, (extension, rpc)
    finally:
        channel.close()


@pytest.mark.parametrize(("unload_over", "load_over"), [("grpc", "http"), ("http", "grpc")])
def test_the_repository_is_one_state_whichever_protocol_changes_it(
    clients: dict[str, Any], unload_over: str, load_over: str
) -> None:
    def states(protocol: str) -> dict[str, str]:
        client = clients[protocol]
        if protocol == "http":
            index = client.get_model_repository_index()
        else:
            index = client.get_model_repository_index(as_json=True)["models"]
        return {e["name"]: e.get("state", "") for e in index if e.get("version", "") == "1.0"}

    assert states("http")["two"] == states("grpc")["two"] == "UNAVAILABLE"
    clients[load_over].load_model("two")
    assert states("http")["two"] == states("grpc")["two"] == "READY"
    assert clients["http"].is_model_ready("two") and clients["grpc"].is_model_ready("two")
    clients[unload_over].unload_model("two")
    assert states("http")["two"] == states("grpc")["two"] == "UNAVAILABLE"
    for protocol in PROTOCOLS:
        with pytest.raises(InferenceServerException):
            clients[protocol].load_model("not-in-the-store")


def test_the_management_operations_are_one_state_over_rest_and_grpc(
    server: LiveServer, ts_stubs: Any
) -> None:
    ports = server.server.state.ports
    channel = grpc.insecure_channel(f"127.0.0.1:{ports.grpc_management}")
    try:
        stub = ts_stubs.management_pb2_grpc.ManagementAPIsServiceStub(channel)
        scale = ts_stubs.management_pb2.ScaleWorkerRequest(
            model_name="one", min_worker=2, max_worker=2, synchronous=True
        )
        stub.ScaleWorker(scale, timeout=120)
        rest = httpx.get(f"{server.management_url}/models/one", timeout=30).json()
        described = ts_stubs.management_pb2.DescribeModelRequest(model_name="one")
        over_grpc = json.loads(stub.DescribeModel(described, timeout=30).msg)
        assert len(rest[0]["workers"]) == len(over_grpc[0]["workers"]) == 2
        assert rest[0]["minWorkers"] == over_grpc[0]["minWorkers"] == 2
        back = httpx.put(f"{server.management_url}/models/one?min_worker=1&synchronous=true")
        assert back.status_code == 200, back.text
        over_grpc = json.loads(stub.DescribeModel(described, timeout=30).msg)
        assert over_grpc[0]["minWorkers"] == 1 and len(over_grpc[0]["workers"]) == 1
        with pytest.raises(grpc.RpcError) as missing:
            stub.DescribeModel(ts_stubs.management_pb2.DescribeModelRequest(model_name="nope"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert httpx.get(f"{server.management_url}/models/nope").status_code == 404
    finally:
        channel.close()


def test_ready_with_no_model_loaded_over_either_protocol(oip_store: Path) -> None:
    with running(oip_store) as live:  # no model asked for at start: ready, as Triton is
        ports = live.server.state.ports
        http = triton_http.InferenceServerClient(f"127.0.0.1:{ports.inference}")
        grpc_client = triton_grpc.InferenceServerClient(f"127.0.0.1:{ports.grpc_inference}")
        try:
            assert httpx.get(f"{live.url}/v2/health/ready").status_code == 200
            assert http.is_server_ready() and grpc_client.is_server_ready()
            assert httpx.get(f"{live.url}/ping").json() == {"status": "Healthy"}
        finally:
            http.close()
            grpc_client.close()


def test_not_ready_while_a_start_up_model_failed(oip_store: Path) -> None:
    with running(oip_store, load_models=["badsig.mar"]) as live:
        assert "badsig.mar" in live.server.state.failed_models
        ready = httpx.get(f"{live.url}/v2/health/ready")
        assert ready.status_code == 503 and ready.json() == {"ready": False}


def _log_settings(client: Any, protocol: str, changes: dict[str, Any] | None = None) -> dict:
    """The log settings over ``protocol``, changed first when ``changes``; plain values."""
    if protocol == "http":
        return client.update_log_settings(changes) if changes else client.get_log_settings()
    if changes:
        client.update_log_settings(changes)
    body = client.get_log_settings(as_json=True)["settings"]
    return {key: next(iter(value.values())) for key, value in body.items()}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_log_settings_are_one_state_over_either_protocol(
    clients: dict[str, Any], protocol: str
) -> None:
    client, other = clients[protocol], clients["grpc" if protocol == "http" else "http"]
    logger = logging.getLogger("torchbay")
    saved = logger.level
    try:
        everything = {"log_info": True, "log_warning": True, "log_error": True}
        _log_settings(client, protocol, {**everything, "log_verbose_level": 0})
        assert logger.getEffectiveLevel() == logging.INFO
        quiet = _log_settings(client, protocol, {"log_info": False})
        assert (quiet["log_info"], quiet["log_warning"]) == (False, True)
        seen = _log_settings(other, "http" if protocol == "grpc" else "grpc")
        assert (seen["log_info"], seen["log_warning"], seen["log_error"]) == (False, True, True)
        assert int(seen["log_verbose_level"]) == 0 and seen["log_format"] == "default"
        assert logger.getEffectiveLevel() == logging.WARNING
        _log_settings(client, protocol, {"log_info": True, "log_verbose_level": 1})
        assert logger.getEffectiveLevel() == logging.DEBUG
        refusals = (
            {"log_info": True, "log_warning": False},
            {"log_file": "/tmp/x.log"},
            {"no_such_setting": True},
        )
        if protocol == "http":  # the gRPC client types each value by its key itself
            refusals += ({"log_info": "yes"},)
        for bad in refusals:
            with pytest.raises(InferenceServerException) as refused:
                _log_settings(client, protocol, bad)
            assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), bad
        assert logger.getEffectiveLevel() == logging.DEBUG  # a refused change changes nothing
    finally:
        logger.setLevel(saved)


def test_a_server_leaves_the_process_log_level_as_it_found_it(oip_store: Path) -> None:
    """The logging extension changes the process's log level; a server that stops puts it back
    (one process runs many servers: a test suite, an embedding application). A request that
    changes nothing sets nothing."""
    logger = logging.getLogger("torchbay")
    before = logger.level
    with running(oip_store) as live:
        assert httpx.post(f"{live.url}/v2/logging", json={}, timeout=30).status_code == 200
        assert logger.level == before  # nothing asked for, nothing set
        verbose = {"log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 1}
        changed = httpx.post(f"{live.url}/v2/logging", json=verbose, timeout=30)
        assert changed.status_code == 200 and changed.json()["log_verbose_level"] == 1
        assert logger.level == logging.DEBUG
    assert logger.level == before


def test_a_grpc_infer_refused_for_its_message_is_recorded_as_rest_s_is(
    server: LiveServer, clients: dict[str, Any]
) -> None:
    """A ModelInfer whose tensors cannot be read (two raw contents for one input) is refused
    INVALID_ARGUMENT, and counted once, as the same refusal over REST is: a fail in the
    statistics, a 400 in /metrics. A bad message to an unknown model is NOT_FOUND, as over REST."""
    request_type, response_type, _, _ = messages.method_types(messages.OIP_SERVICE, "ModelInfer")
    channel = grpc.insecure_channel(f"127.0.0.1:{server.server.state.ports.grpc_inference}")
    infer = channel.unary_unary(
        f"/{messages.OIP_SERVICE}/ModelInfer",
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString,
    )

    def bad(model: str) -> grpc.StatusCode:
        request = request_type(model_name=model, raw_input_contents=[b"\0" * 256, b"\0" * 4])
        request.inputs.add(name="input0", datatype="FP32", shape=[1, 64])
        with pytest.raises(grpc.RpcError) as refused:
            infer(request, timeout=30)
        return refused.value.code()

    try:
        before, metrics_before = _stats(clients["http"], "http"), _metrics(server)
        assert bad("one") == grpc.StatusCode.INVALID_ARGUMENT
        assert bad("nope") == grpc.StatusCode.NOT_FOUND
        after, metrics = _stats(clients["http"], "http"), _metrics(server)
        assert (after["fail"] - before["fail"], after["success"] - before["success"]) == (1, 0)
        assert metrics["code 400"] - metrics_before.get("code 400", 0) == 1
        assert metrics["ts"] - metrics_before.get("ts", 0) == 1
    finally:
        channel.close()
