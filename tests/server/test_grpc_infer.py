"""ModelInfer and ModelStreamInfer end to end: tritonclient.grpc and the kserve SDK against
models whose worker speaks the OIP binary tensor data extension (the body ModelInfer becomes).

``sub`` (TorchScript ``a - b``: inputs go by name), ``pair`` (two outputs) and ``shout`` (a
function handler, BYTES in and out); signatures from model-config.yaml."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from torchbay.archiver.package import ArchiveOptions, package
from torchbay.server.grpc import messages

from .conftest import LiveServer, make_config
from .test_oip import CLIENTS, Pair, Sub  # the same two models the HTTP tests serve

SHOUT = """
def handle(data, context):
    if data is None:
        return None
    return [bytes(row["body"]).decode().upper() for row in data]
"""


def _spec(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


SIGNATURES = {
    "sub": {"inputs": [_spec("a", "FP32", [-1, 3]), _spec("b", "FP32", [-1, 3])],
            "outputs": [_spec("diff", "FP32", [-1, 3])]},
    "pair": {"inputs": [_spec("x", "FP32", [-1, 2])],
             "outputs": [_spec("double", "FP32", [-1, 2]), _spec("plus", "FP32", [-1, 2])]},
    "shout": {"inputs": [_spec("text", "BYTES", [1])]},
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("grpc-oip-store")
    work = tmp_path_factory.mktemp("grpc-oip-build")
    for name, signature in SIGNATURES.items():
        config = work / f"{name}.yaml"
        config.write_text(json.dumps(signature))  # JSON is YAML
        options: dict[str, Any] = {"config_file": config}
        if name == "shout":
            (work / "shout.py").write_text(SHOUT)
            options["handler"] = str(work / "shout.py")
        else:
            model = torch.jit.script((Sub() if name == "sub" else Pair()).eval())
            torch.jit.save(model, str(work / f"{name}.pt"))
            options.update(handler="tensor", serialized_file=work / f"{name}.pt")
        package(ArchiveOptions(model_name=name, version="1", export_path=root, **options))
    live = LiveServer(make_config(root, load_models=["all"])).start()
    yield live
    live.stop()


@pytest.fixture
def client(server: LiveServer) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(f"127.0.0.1:{server.server.state.ports.grpc_inference}")
    yield c
    c.close()


def _input(name: str, array: np.ndarray, datatype: str) -> triton.InferInput:
    tensor = triton.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


A = np.array([[5.0, 7.0, 9.0]], dtype=np.float32)
B = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)


def test_model_infer_raw_tensors_by_name(client) -> None:
    result = client.infer("sub", [_input("b", B, "FP32"), _input("a", A, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("diff"), A - B)
    response = result.get_response()
    assert response.model_name == "sub" and response.model_version == "1"
    assert len(response.raw_output_contents) == 1


def test_requested_outputs_and_all_outputs(client) -> None:
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    only = client.infer("pair", [_input("x", x, "FP32")],
                        outputs=[triton.InferRequestedOutput("plus")])  # fmt: skip
    assert [o.name for o in only.get_response().outputs] == ["plus"]
    np.testing.assert_array_equal(only.as_numpy("plus"), x + 1)
    both = client.infer("pair", [_input("x", x, "FP32")], request_id="req-1")
    assert {o.name for o in both.get_response().outputs} == {"double", "plus"}
    np.testing.assert_array_equal(both.as_numpy("double"), x * 2)
    assert both.get_response().id == "req-1"


def test_bytes_in_and_out(client) -> None:
    text = np.array([b"hello"], dtype=np.object_)
    result = client.infer("shout", [_input("text", text, "BYTES")])
    assert result.as_numpy("output0").tolist() == [b"HELLO"]


def test_typed_contents_are_packed_for_the_worker(server: LiveServer) -> None:
    request_type, response_type, *_ = messages.method_types(messages.OIP_SERVICE, "ModelInfer")
    port = server.server.state.ports.grpc_inference
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        infer = channel.unary_unary(
            f"/{messages.OIP_SERVICE}/ModelInfer",
            request_serializer=request_type.SerializeToString,
            response_deserializer=response_type.FromString,
        )
        request = request_type(model_name="sub")
        for name, values in (("a", [5.0, 7.0, 9.0]), ("b", [1.0, 2.0, 3.0])):
            request.inputs.add(name=name, datatype="FP32", shape=[1, 3]).contents.fp32_contents[
                :
            ] = values
        response = infer(request, timeout=60)
    assert struct.unpack("<3f", response.raw_output_contents[0]) == (4.0, 5.0, 6.0)


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        ([_input("a", A, "FP32")], "'b'"),  # missing input, named
        ([_input("a", A, "FP32"), _input("zz", B, "FP32")], "zz"),
        ([_input("a", A, "FP32"), _input("b", B.astype(np.float64), "FP64")], "FP64"),
    ],
)
def test_bad_inputs_are_invalid_argument_naming_the_tensor(client, inputs, words) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("sub", inputs)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert words in info.value.message() and "Traceback" not in info.value.message()


def test_model_stream_infer_answers_each_request(client) -> None:
    results: list[tuple[Any, Any]] = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    for i in range(3):
        b = B * i
        client.async_stream_infer("sub", [_input("a", A, "FP32"), _input("b", b, "FP32")],
                                  request_id=f"s{i}")  # fmt: skip
    client.async_stream_infer("sub", [_input("a", A, "FP32")], request_id="bad")
    client.stop_stream()
    assert len(results) == 4
    good = {r.get_response().id: r.as_numpy("diff") for r, e in results if e is None}
    assert sorted(good) == ["s0", "s1", "s2"]
    for i in range(3):
        np.testing.assert_array_equal(good[f"s{i}"], A - B * i)
    errors = [e for r, e in results if e is not None]
    assert len(errors) == 1 and "'b'" in errors[0].message()


def test_kserve_sdk_infers_over_grpc(server: LiveServer) -> None:
    url = f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    out = subprocess.run(
        [sys.executable, str(CLIENTS / "kserve_client.py"), url, "", "pair", "pair"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["model_ready"] is True
    assert result["infer"] == {"double": [[2.0, 4.0]], "plus": [[2.0, 3.0]]}


def test_a_message_that_does_not_parse_is_invalid_argument(server: LiveServer, client) -> None:
    """Bytes that are no ModelInferRequest: INVALID_ARGUMENT, unary and in a stream (were
    grpc's UNKNOWN "Unexpected <class DecodeError>", and INTERNAL logged as a bug of ours)."""
    garbage = b"\xff\xff\xff\xff\x0f not a message"
    service = "/inference.GRPCInferenceService"
    with grpc.insecure_channel(f"127.0.0.1:{server.server.state.ports.grpc_inference}") as ch:
        infer = ch.unary_unary(f"{service}/ModelInfer")
        stream = ch.stream_stream(f"{service}/ModelStreamInfer")
        for call in (lambda: infer(garbage, timeout=30), lambda: list(stream(iter([garbage])))):
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid inference.ModelInferRequest" in info.value.details()
    assert client.is_server_live()
