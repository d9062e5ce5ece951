"""How an OIP input meets a half-precision model (issue 28), below the server: the signature check
casts FP32 to a declared FP16/BF16 input as torch would and refuses every other mismatch, and the
tensor handler takes binary data in the model's dtype in place from the request body. The model is
an fp16 archive packed by our archiver (``tests/data/fp16_before_28/make.py``'s affine model)."""

from __future__ import annotations

import importlib.util
import json
import mmap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.server.conftest import tensor_archive
from torchbay.archiver.signature import Signature, TensorSpec
from torchbay.handlers.errors import BadInput
from torchbay.handlers.runtime import oip
from torchbay.handlers.runtime.service import load_service

DATA = Path(__file__).resolve().parents[1] / "data" / "fp16_before_28"
HEADER = "inference-header-content-length"
VALUES = np.array([[1.0, -2.5, 3.1415927, 70000.0], [1e-8, 0.1, -0.0, 65504.0]], dtype="<f4")
HALF = np.array([[1.0, -2.5, 3.140625, 0.1], [1e-4, -0.0, 65504.0, 2.0]], dtype="<f2")


def _binary(datatype: str, array: np.ndarray, name: str = "input0") -> tuple[bytes, dict]:
    data = array.tobytes()
    tensor = {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "parameters": {"binary_data_size": len(data)},
    }
    header = json.dumps({"inputs": [tensor]}).encode()
    return header + data, {HEADER: str(len(header))}


def _signature(datatype: str) -> Signature:
    return Signature(inputs=[TensorSpec(name="input0", datatype=datatype, shape=[-1, 4])])


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize(("datatype", "dtype"), [("FP16", torch.float16), ("BF16", torch.bfloat16)])
def test_fp32_to_a_declared_half_input_is_cast_as_torch_casts(
    binary: bool, datatype: str, dtype: torch.dtype
) -> None:
    if binary:
        body, headers = _binary("FP32", VALUES)
    else:
        tensor = {
            "name": "input0",
            "datatype": "FP32",
            "shape": [2, 4],
            "data": VALUES.reshape(-1).tolist(),
        }
        body, headers = json.dumps({"inputs": [tensor]}).encode(), {}
    request = oip.parse_request(body, headers)
    oip.check_signature(request, _signature(datatype))
    [tensor] = request["inputs"]
    assert tensor["datatype"] == datatype
    got = torch.from_numpy(tensor["array"].astype(tensor["array"].dtype.newbyteorder("=")))
    if datatype == "BF16":
        got = got.view(torch.int16).view(torch.bfloat16)
    want = torch.from_numpy(VALUES).to(dtype)  # 70000 is inf in fp16, finite in bf16
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("given", "declared", "message"),
    [
        ("INT32", "FP16", "has datatype INT32; the model expects FP16 (or FP32, cast to it)"),
        ("FP64", "BF16", "has datatype FP64; the model expects BF16 (or FP32, cast to it)"),
        ("FP16", "FP32", "has datatype FP16; the model expects FP32"),  # an archive before 28
        ("FP32", "FP64", "has datatype FP32; the model expects FP64"),  # no widening either
    ],
)
def test_every_other_mismatch_is_refused(given: str, declared: str, message: str) -> None:
    dtype = {"INT32": "<i4", "FP64": "<f8", "FP16": "<f2", "FP32": "<f4"}[given]
    request = oip.parse_request(*_binary(given, np.ones((1, 4), dtype=dtype)))
    with pytest.raises(BadInput) as info:
        oip.check_signature(request, _signature(declared))
    assert info.value.message == f"input 'input0' {message}"


@pytest.fixture(scope="module")
def fp16_service(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The worker's Service over an fp16 TorchScript archive packed by our archiver."""
    spec = importlib.util.spec_from_file_location("_fp16_make", DATA / "make.py")
    assert spec is not None and spec.loader is not None
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    work = tmp_path_factory.mktemp("half-inputs")
    (work / "affine.py").write_text(make.MODEL)
    torch.save(make.weights(), work / "affine.pt")
    torch.save(torch.ones(2, 4), work / "x.pt")
    out = tensor_archive(
        work,
        "h16",
        work / "affine.pt",
        work / "x.pt",
        model_file=work / "affine.py",
        convert="torchscript-trace",
        precision="fp16",
        archive_format="no-archive",
    )
    return load_service(out)


def test_fp16_binary_data_becomes_the_tensor_in_place(fp16_service: Any) -> None:
    body, headers = _binary("FP16", HALF)
    request = oip.parse_request(body, headers)
    oip.check_signature(request, fp16_service.signature)
    tensor = fp16_service.handler._v2_tensor(request["inputs"][0])
    start = np.frombuffer(body, dtype=np.uint8).ctypes.data
    assert tensor.dtype == torch.float16 and torch.equal(tensor, torch.from_numpy(HALF))
    assert start <= tensor.data_ptr() < start + len(body)  # the request's own bytes, no copy


def test_a_read_only_buffer_the_request_does_not_own_is_copied(fp16_service: Any) -> None:
    """A shared memory region, say: the model may write into its input, never into that."""
    data = HALF.tobytes()
    with mmap.mmap(-1, len(data)) as region:
        region.write(data)
        view = memoryview(region).toreadonly()
        array = np.frombuffer(view, dtype="<f2").reshape(2, 4)
        spec = {"name": "input0", "datatype": "FP16", "shape": [2, 4], "array": array}
        tensor = fp16_service.handler._v2_tensor(spec)
        assert torch.equal(tensor, torch.from_numpy(HALF))
        assert tensor.data_ptr() != array.ctypes.data
        del array, view, spec
