"""Triton's ``max_batch_size`` on a real server, with tritonclient over HTTP and gRPC: the model
configuration shows a batched model's batch size as ``max_batch_size``, and an OIP request whose
batch dimension is larger is refused as Triton refuses it (``inference request batch-size must
be <= N for 'm'``: 400 / INVALID_ARGUMENT) once somebody declared a batch size above 1 (a
repository load's ``max_batch_size``, or TorchServe's ``batch_size`` at registration). At 1,
TorchServe's default that nobody declared, a request of any batch size still runs alone. A
request whose inputs disagree on the batch size is refused as Triton refuses it, whatever the
model's batch size."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from .conftest import LiveServer, oip_client
from .test_plane_parity import server  # noqa: F401  (the fixture: one.mar loaded, model API on)

pytestmark = pytest.mark.slow

PROTOCOLS = ("http", "grpc")


@pytest.fixture(scope="module")
def clients(server: LiveServer) -> Iterator[dict[str, Any]]:  # noqa: F811
    """tritonclient's HTTP and gRPC clients of the module's server (the parity test's)."""
    with oip_client(server, "http") as http, oip_client(server, "grpc") as grpc:
        yield {"http": http, "grpc": grpc}


def _infer(client: Any, protocol: str, model: str, rows: int, inputs: dict[str, int]) -> Any:
    module = triton_http if protocol == "http" else triton_grpc
    tensors = []
    for name, width in inputs.items():
        tensor = module.InferInput(name, [rows, width], "FP32")
        tensor.set_data_from_numpy(np.zeros((rows, width), dtype=np.float32))
        tensors.append(tensor)
    return client.infer(model, tensors)


def _refused(client: Any, protocol: str, model: str, rows: int, inputs: dict[str, int]) -> str:
    with pytest.raises(InferenceServerException) as refused:
        _infer(client, protocol, model, rows, inputs)
    expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert refused.value.status() == expected, refused.value.message()
    return refused.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_batch_past_a_loaded_max_batch_size_is_refused_in_tritons_words(
    clients: dict[str, Any], protocol: str
) -> None:
    client = clients[protocol]
    two = {"features": 64, "extra": 3}
    client.load_model("two", config=json.dumps({"max_batch_size": 2}))
    try:
        assert _max_batch_size(client, protocol, "two") == 2
        assert _infer(client, protocol, "two", 2, two).as_numpy("output0").shape == (2, 5)
        message = _refused(client, protocol, "two", 3, two)
        assert message == "inference request batch-size must be <= 2 for 'two'"
        # a live change of the loaded model holds its requests to the new size at once
        client.load_model("two", config=json.dumps({"max_batch_size": 4}))
        assert _infer(client, protocol, "two", 4, two).as_numpy("output0").shape == (4, 5)
        assert "<= 4 for 'two'" in _refused(client, protocol, "two", 5, two)
    finally:
        client.unload_model("two")


def test_torchserves_declared_batch_size_is_the_same_bound(
    server: LiveServer,  # noqa: F811
    clients: dict[str, Any],
) -> None:
    """A batch size registered through TorchServe's management API is the one the model
    configuration shows, so OIP requests are held to it over either protocol; TorchServe's own
    route takes the request as TorchServe does."""
    url = f"{server.management_url}/models?url=one.mar&model_name=pair&batch_size=2"
    registered = httpx.post(f"{url}&max_batch_delay=5&initial_workers=1&synchronous=true")
    assert registered.status_code == 200, registered.text
    try:
        for protocol in PROTOCOLS:
            client = clients[protocol]
            assert _max_batch_size(client, protocol, "pair") == 2
            result = _infer(client, protocol, "pair", 2, {"input0": 64})
            assert result.as_numpy("output0").shape == (2, 10)
            message = _refused(client, protocol, "pair", 3, {"input0": 64})
            assert message == "inference request batch-size must be <= 2 for 'pair'"
        rows = np.zeros((3, 64), dtype=np.float32).tobytes()
        ts = httpx.post(f"{server.url}/predictions/pair", content=rows, timeout=60)
        assert ts.status_code == 200, ts.text
    finally:
        httpx.delete(f"{server.management_url}/models/pair", timeout=60)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_batch_size_nobody_declared_holds_no_request_back(
    clients: dict[str, Any], protocol: str
) -> None:
    """``one`` has TorchServe's default batch size, 1: each request runs alone, whatever its
    batch dimension (a limit of 1 would be ours, not the user's)."""
    client = clients[protocol]
    assert _max_batch_size(client, protocol, "one") == 1
    result = _infer(client, protocol, "one", 5, {"input0": 64})
    assert result.as_numpy("output0").shape == (5, 10)


def _max_batch_size(client: Any, protocol: str, model: str) -> int:
    if protocol == "http":
        return client.get_model_config(model)["max_batch_size"]
    return int(client.get_model_config(model, as_json=True)["config"]["max_batch_size"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_whose_batch_sizes_differ_are_refused_in_tritons_words(
    clients: dict[str, Any], protocol: str
) -> None:
    """``two`` takes features [-1, 64] and extra [-1, 3]: one batch dimension. A request giving
    them different batch sizes was run anyway: 1 and 2 rows failed as the model's fault (500,
    'has no batch dimension'), 2 and 1 were answered with a broadcast the client never asked
    for. Triton refuses both before the model runs."""
    client = clients[protocol]
    client.load_model("two")
    try:
        module = triton_http if protocol == "http" else triton_grpc
        for features, extra in ((1, 2), (2, 1)):
            tensors = [module.InferInput("features", [features, 64], "FP32")]
            tensors.append(module.InferInput("extra", [extra, 3], "FP32"))
            tensors[0].set_data_from_numpy(np.zeros((features, 64), dtype=np.float32))
            tensors[1].set_data_from_numpy(np.zeros((extra, 3), dtype=np.float32))
            with pytest.raises(InferenceServerException) as refused:
                client.infer("two", tensors)
            expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
            assert refused.value.status() == expected, refused.value.message()
            assert refused.value.message() == (
                "input 'extra' batch size does not match other inputs for 'two'"
            )
        two = {"features": 64, "extra": 3}
        assert _infer(client, protocol, "two", 3, two).as_numpy("output0").shape == (3, 5)
    finally:
        client.unload_model("two")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inference_count_counts_a_batched_request_s_rows(
    server: LiveServer,  # noqa: F811
    clients: dict[str, Any],
    protocol: str,
) -> None:
    """Triton's ``inference_count``: "each inference in a batched request is counted", so a
    request of 5 rows to a model that batches (``one``: max_batch_size 1) counts 5; a
    TorchServe request counts one, whatever its body. Before, every request counted one."""
    client = clients[protocol]

    def counted() -> int:
        if protocol == "http":
            stats = client.get_inference_statistics("one")
        else:
            stats = client.get_inference_statistics("one", as_json=True)
        return int(stats["model_stats"][0].get("inference_count", 0))

    before = counted()
    _infer(client, protocol, "one", 5, {"input0": 64})
    _infer(client, protocol, "one", 1, {"input0": 64})
    rows = np.zeros((3, 64), dtype=np.float32).tobytes()
    assert httpx.post(f"{server.url}/predictions/one", content=rows, timeout=60).status_code == 200
    assert counted() - before == 5 + 1 + 1
