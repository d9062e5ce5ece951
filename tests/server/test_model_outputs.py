"""What the tensor handler answers for a model's outputs.

It splits every output of a batched model along its first dimension, one part per request. An
output without one row per input row (a scalar, a table the model returns whole), in an archive
packed without the archiver's check (no example input), is the model's fault: a 500 naming the
output over every protocol, never a 422 blaming the request nor a silently wrong slice of the
table; so is a nested output (a tuple in the tuple). Unsigned outputs are answered in the
datatype the archive declares for them (UINT16...)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from torch import nn
from tritonclient.utils import InferenceServerException

from .conftest import LiveServer, oip_client, running, scripted_archive

pytestmark = pytest.mark.slow

X = np.arange(8, dtype=np.float32).reshape(2, 4)


class WithScalar(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x.sum()


class WithTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(5, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, self.table * 1.0


class Nested(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        return x, (x * 2, x * 3)


class Unsigned(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x.abs() * 10
        return y.to(torch.uint16), y.to(torch.uint32), y.to(torch.uint64)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    work = tmp_path_factory.mktemp("batch-outputs")
    store = work / "store"
    store.mkdir()
    for name, model in (("scalar", WithScalar()), ("table", WithTable()), ("nested", Nested())):
        scripted_archive(model, name, work, store)
    torch.save(torch.from_numpy(X), work / "x.pt")
    scripted_archive(Unsigned(), "unsigned", work, store, example_input=work / "x.pt")
    models = ["scalar.mar", "table.mar", "nested.mar", "unsigned.mar"]
    with running(store, load_models=models) as live:
        yield live


def _refusal(name: str, shape: list[int]) -> str:
    return f"the model's output 'output1' of shape {shape} has no batch dimension"


@pytest.mark.parametrize(("model", "shape"), [("scalar", []), ("table", [5])])
def test_an_output_without_the_batch_dimension_is_a_500_naming_it(
    server: LiveServer, model: str, shape: list[int]
) -> None:
    tensor = {"name": "input0", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}
    v2 = httpx.post(f"{server.url}/v2/models/{model}/infer", json={"inputs": [tensor]})
    assert v2.status_code == 500, v2.text
    assert _refusal(model, shape) in v2.json()["error"]
    torchserve = httpx.post(f"{server.url}/predictions/{model}", json=X.tolist())
    assert torchserve.status_code == 500, torchserve.text
    assert _refusal(model, shape) in torchserve.json()["message"]
    assert "Traceback" not in v2.text + torchserve.text


def test_a_nested_output_is_a_500_naming_it(server: LiveServer) -> None:
    tensor = {"name": "input0", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}
    v2 = httpx.post(f"{server.url}/v2/models/nested/infer", json={"inputs": [tensor]})
    torchserve = httpx.post(f"{server.url}/predictions/nested", json=X.tolist())
    for response in (v2, torchserve):
        assert response.status_code == 500, response.text
        assert "the model's output 'output1' is a tuple, not a tensor" in response.text


def test_over_grpc_it_is_internal(server: LiveServer) -> None:
    with oip_client(server, "grpc") as client:
        request = triton_grpc.InferInput("input0", [2, 4], "FP32")
        request.set_data_from_numpy(X)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("table", [request])
    assert caught.value.status() == "StatusCode.INTERNAL"
    assert _refusal("table", [5]) in caught.value.message()


def test_the_worker_keeps_serving(server: LiveServer) -> None:
    pids = server.worker_pids()
    for _ in range(3):
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}
        assert httpx.post(f"{server.url}/v2/models/scalar/infer", json=body).status_code == 500
    assert server.worker_pids() == pids


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unsigned_outputs_are_answered_in_their_declared_datatype(
    server: LiveServer, protocol: str
) -> None:
    declared = ["UINT16", "UINT32", "UINT64"]
    metadata = httpx.get(f"{server.url}/v2/models/unsigned").json()
    assert [o["datatype"] for o in metadata["outputs"]] == declared
    module = triton_grpc if protocol == "grpc" else triton_http
    with oip_client(server, protocol) as client:
        request = module.InferInput("input0", [2, 4], "FP32")
        request.set_data_from_numpy(X)
        result = client.infer("unsigned", [request])
    outputs = result.get_response(as_json=True) if protocol == "grpc" else result.get_response()
    assert [o["datatype"] for o in outputs["outputs"]] == declared
    for k, dtype in enumerate((np.uint16, np.uint32, np.uint64)):
        got = result.as_numpy(f"output{k}")
        assert got.dtype == dtype and got.tolist() == (np.abs(X) * 10).astype(dtype).tolist()


def test_unsigned_outputs_in_json(server: LiveServer) -> None:
    tensor = {"name": "input0", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}
    response = httpx.post(f"{server.url}/v2/models/unsigned/infer", json={"inputs": [tensor]})
    assert response.status_code == 200, response.text
    first = response.json()["outputs"][0]
    assert first["datatype"] == "UINT16" and first["data"] == (np.abs(X) * 10).ravel().tolist()
