"""Issue 28 on a live server with tritonclient (HTTP and gRPC): fp16/bf16 archives declare and
answer their own datatype, archives packed before that keep serving as they did, and a model
without a batch dimension takes each request's tensors whole.

Every archive is built by our archiver here, from ``tests/data/fp16_before_28/make.py``'s affine
model (weights and inputs exactly representable in fp16 and bf16, so answers compare exactly),
except ``legacy-fp16`` and ``legacy-bf16``: that folder's archives, packed by the archiver before
the change (a float32 wrapper, a signature that says FP32).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ml_dtypes
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from torch import nn
from tritonclient.utils import InferenceServerException

from torchbay.archiver.package import ArchiveOptions, package

from .conftest import LiveServer, running

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data" / "fp16_before_28"
X = np.array([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 0.25, 2.0]], dtype=np.float32)
Y = np.array([[7.5, 2.0, 3.5], [4.25, 0.625, -0.375]], dtype=np.float32)  # X @ W.T + b, exact
BLOCK = np.arange(12, dtype=np.float32).reshape(3, 4)  # the unbatched model's whole input


class Total(nn.Module):
    """Column sums of a [3, 4] block: a model whose input has no batch dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(0)


def _yaml(batch_size: int, delay_ms: int, **settings: Any) -> str:
    signature = {
        "inputs": [{"name": "block", "datatype": "FP32", "shape": [3, 4]}],
        "outputs": [{"name": "total", "datatype": "FP32", "shape": [4]}],
    }
    return json.dumps({"batchSize": batch_size, "maxBatchDelay": delay_ms, **signature, **settings})


def _affine_module() -> Any:
    spec = importlib.util.spec_from_file_location("_fp16_make", DATA / "make.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_store(root: Path, work: Path) -> None:
    make = _affine_module()
    (work / "affine.py").write_text(make.MODEL)
    torch.save(make.weights(), work / "affine.pt")
    torch.save(torch.from_numpy(X), work / "x.pt")
    eager = {
        "handler": "tensor",
        "model_file": work / "affine.py",
        "serialized_file": work / "affine.pt",
        "example_input": work / "x.pt",
    }
    for name, convert, precision in (("h16", "torchscript-trace", "fp16"), ("b16", "none", "bf16")):
        package(
            ArchiveOptions(
                model_name=name,
                version="1",
                export_path=root,
                convert=convert,
                precision=precision,
                **eager,
            )
        )
    for legacy in ("legacy-fp16.mar", "legacy-bf16.mar"):
        shutil.copyfile(DATA / legacy, root / legacy)
    torch.jit.save(torch.jit.script(Total().eval()), str(work / "total.pt"))
    # ``whole`` never waits for a batch; ``pair`` waits for two requests (each then runs alone)
    # and has priority levels
    levels = {"priorityLevels": 2, "defaultPriorityLevel": 2}
    for name, batch_size, delay_ms, more in (("whole", 4, 0, {}), ("pair", 2, 60_000, levels)):
        (work / f"{name}.yaml").write_text(_yaml(batch_size, delay_ms, **more))
        package(
            ArchiveOptions(
                model_name=name,
                version="1",
                export_path=root,
                handler="tensor",
                serialized_file=work / "total.pt",
                config_file=work / f"{name}.yaml",
            )
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("precision-store")
    _build_store(root, tmp_path_factory.mktemp("precision-build"))
    with running(root, load_models=["all"]) as live:
        yield live


def _http_input(name: str, array: np.ndarray, datatype: str, binary: bool = True) -> Any:
    tensor = triton_http.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _grpc_input(name: str, array: np.ndarray, datatype: str) -> Any:
    tensor = triton_grpc.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _out(binary: bool) -> list[Any]:
    return [triton_http.InferRequestedOutput("output0", binary_data=binary)]


# -- an fp16 / bf16 archive declares its datatype ------------------------------------------------


@pytest.mark.parametrize(("model", "datatype"), [("h16", "FP16"), ("b16", "BF16")])
def test_the_archive_declares_its_half_datatype_everywhere(
    server: LiveServer, oip_http: Any, oip_grpc: Any, model: str, datatype: str
) -> None:
    meta = oip_http.get_model_metadata(model)
    assert [t["datatype"] for t in meta["inputs"] + meta["outputs"]] == [datatype, datatype]
    config = oip_http.get_model_config(model)
    assert config["input"][0]["data_type"] == config["output"][0]["data_type"] == f"TYPE_{datatype}"
    over_grpc = oip_grpc.get_model_config(model, as_json=True)["config"]
    assert over_grpc["input"][0]["data_type"] == f"TYPE_{datatype}"
    [described] = httpx.get(f"{server.management_url}/models/{model}").json()
    assert described["precision"] == datatype.lower()
    assert described["inputs"][0] == {"name": "input0", "datatype": datatype, "shape": [-1, 4]}
    assert described["outputs"][0]["datatype"] == datatype and described["batched"] is True


@pytest.mark.parametrize("binary_out", [True, False])
def test_fp16_in_fp16_out(oip_http: Any, binary_out: bool) -> None:
    result = oip_http.infer(
        "h16", [_http_input("input0", X.astype(np.float16), "FP16")], outputs=_out(binary_out)
    )
    assert result.get_output("output0")["datatype"] == "FP16"
    got = result.as_numpy("output0")
    assert got.dtype == np.float16 and np.array_equal(got, Y.astype(np.float16))
    if not binary_out:  # JSON ``data``: numbers
        assert result.get_output("output0")["data"] == Y.reshape(-1).tolist()


@pytest.mark.parametrize("binary_in", [True, False])
def test_fp32_in_is_cast_and_answered_in_fp16(oip_http: Any, binary_in: bool) -> None:
    result = oip_http.infer("h16", [_http_input("input0", X, "FP32", binary_in)])
    assert result.get_output("output0")["datatype"] == "FP16"
    assert np.array_equal(result.as_numpy("output0"), Y.astype(np.float16))


@pytest.mark.parametrize("model", ["h16", "b16"])
def test_another_datatype_is_a_clear_400(server: LiveServer, model: str) -> None:
    body = {"inputs": [{"name": "input0", "datatype": "INT32", "shape": [1, 4], "data": [1] * 4}]}
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body)
    assert response.status_code == 400
    message = response.json()["error"]
    half = "FP16" if model == "h16" else "BF16"
    assert message == (
        f"input 'input0' has datatype INT32; the model expects {half} (or FP32, cast to it)"
    )


def test_fp16_over_grpc_raw_contents(oip_grpc: Any) -> None:
    for array, datatype in ((X.astype(np.float16), "FP16"), (X, "FP32")):
        result = oip_grpc.infer("h16", [_grpc_input("input0", array, datatype)])
        output = result.get_response().outputs[0]
        assert output.datatype == "FP16"
        raw = result.get_response().raw_output_contents[0]
        assert np.array_equal(np.frombuffer(raw, "<f2").reshape(2, 3), Y.astype(np.float16))
    with pytest.raises(InferenceServerException) as info:
        oip_grpc.infer("h16", [_grpc_input("input0", X.astype(np.int32), "INT32")])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "the model expects FP16" in info.value.message()


def test_bf16_in_and_out_over_http_and_grpc(oip_http: Any, oip_grpc: Any) -> None:
    x = X.astype(ml_dtypes.bfloat16)
    for client, make in ((oip_http, _http_input), (oip_grpc, _grpc_input)):
        for array, datatype in ((x, "BF16"), (X, "FP32")):
            result = client.infer("b16", [make("input0", array, datatype)])
            got = result.as_numpy("output0")
            assert got.dtype == ml_dtypes.bfloat16, (client, datatype)
            assert np.array_equal(got.astype(np.float32), Y)


def test_torchserve_requests_to_an_fp16_model_keep_working(server: LiveServer) -> None:
    response = httpx.post(f"{server.url}/predictions/h16", json=X.tolist())
    assert response.status_code == 200, response.text
    assert response.json() == {"output": Y.tolist()}


# -- archives packed before the change: FP32 declared, served as before ----------------------------


@pytest.mark.parametrize("model", ["legacy-fp16", "legacy-bf16"])
def test_an_archive_packed_before_serves_as_it_did(
    server: LiveServer, oip_http: Any, model: str
) -> None:
    meta = oip_http.get_model_metadata(model)
    assert [t["datatype"] for t in meta["inputs"] + meta["outputs"]] == ["FP32", "FP32"]
    result = oip_http.infer(model, [_http_input("input0", X, "FP32")])
    assert result.get_output("output0")["datatype"] == "FP32"
    assert np.array_equal(result.as_numpy("output0"), Y)
    half = X.astype(np.float16)
    body = {
        "inputs": [
            {
                "name": "input0",
                "datatype": "FP16",
                "shape": [2, 4],
                "data": half.reshape(-1).tolist(),
            }
        ]
    }
    refused = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body)
    assert refused.status_code == 400
    assert refused.json()["error"] == "input 'input0' has datatype FP16; the model expects FP32"
    predicted = httpx.post(f"{server.url}/predictions/{model}", json=X.tolist())
    assert predicted.json() == {"output": Y.tolist()}


# -- a model without a batch dimension -----------------------------------------------------------


def test_an_unbatched_model_is_described_without_a_batch_dimension(
    server: LiveServer, oip_http: Any, oip_grpc: Any
) -> None:
    config = oip_http.get_model_config("whole")
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert config["input"] == [{"name": "block", "data_type": "TYPE_FP32", "dims": [3, 4]}]
    message = oip_grpc.get_model_config("whole").config
    assert message.max_batch_size == 0 and not message.HasField("dynamic_batching")
    assert list(message.input[0].dims) == [3, 4]
    # With priority levels it shows them, as Triton's dynamic batcher takes max_batch_size 0
    # models too (they were left out with the whole section).
    config = oip_http.get_model_config("pair")
    assert config["max_batch_size"] == 0 and config["dynamic_batching"]["priority_levels"] == 2
    message = oip_grpc.get_model_config("pair").config
    assert message.dynamic_batching.default_priority_level == 2
    [described] = httpx.get(f"{server.management_url}/models/whole").json()
    assert described["batched"] is False and described["batchSize"] == 4


def test_an_unbatched_model_takes_its_exact_shape(
    server: LiveServer, oip_http: Any, oip_grpc: Any
) -> None:
    for client, make in ((oip_http, _http_input), (oip_grpc, _grpc_input)):
        result = client.infer("whole", [make("block", BLOCK, "FP32")])
        got = result.as_numpy("total")
        assert got.shape == (4,) and np.array_equal(got, BLOCK.sum(0))
    # TorchServe's route: the request's tensor is the whole input too, answered whole
    predicted = httpx.post(f"{server.url}/predictions/whole", json=BLOCK.tolist())
    assert predicted.status_code == 200 and predicted.json() == {"output": BLOCK.sum(0).tolist()}


@pytest.mark.parametrize("shape", [[1, 3, 4], [4, 3], [3, 4, 1], [12]])
def test_an_unbatched_model_refuses_another_shape(
    server: LiveServer, oip_grpc: Any, shape: list[int]
) -> None:
    body = {"inputs": [{"name": "block", "datatype": "FP32", "shape": shape, "data": [1.0] * 12}]}
    response = httpx.post(f"{server.url}/v2/models/whole/infer", json=body)
    assert response.status_code == 400
    assert response.json()["error"] == (
        f"input 'block' has shape {shape}; the model expects [3, 4] (-1: any size)"
    )
    with pytest.raises(InferenceServerException) as info:
        oip_grpc.infer("whole", [_grpc_input("block", BLOCK.reshape(shape), "FP32")])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def _block_request(block: np.ndarray) -> dict[str, Any]:
    tensor = {"name": "block", "datatype": "FP32", "shape": list(block.shape)}
    return {"inputs": [{**tensor, "data": block.reshape(-1).tolist()}]}


def test_concurrent_requests_to_an_unbatched_model_each_run_alone(server: LiveServer) -> None:
    """``pair`` takes batches of two (and waits for them): two requests arrive in one batch, and
    each is answered with its own block's sums, never with those of the two concatenated."""
    blocks = [BLOCK, -2 * BLOCK + 1]

    async def send() -> list[httpx.Response]:
        url = f"{server.url}/v2/models/pair/infer"
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(url, json=_block_request(b)) for b in blocks))

    responses = asyncio.run(send())
    for response, block in zip(responses, blocks, strict=True):
        assert response.status_code == 200, response.text
        [output] = response.json()["outputs"]
        assert output["shape"] == [4] and output["data"] == block.sum(0).tolist()
    [stats] = httpx.get(f"{server.url}/v2/models/pair/stats").json()["model_stats"]
    assert (stats["inference_count"], stats["execution_count"]) == (2, 1)  # one batch of two
