from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest
import torch

from torchbay.handlers.runtime.service import load_service

from .conftest import body_json, req, write_manifest

X = [1.0, 2.0, 3.0, 4.0]


def expected(model: torch.nn.Module, x: list[float]) -> list[float]:
    with torch.no_grad():
        return model(torch.tensor([x])).tolist()[0]


def test_json_npy_raw_in_one_batch(torchscript_dir, tiny_model) -> None:
    service = load_service(torchscript_dir(), batch_size=3)
    buf = io.BytesIO()
    np.save(buf, np.array(X, dtype=np.float32))
    outcome = service.predict(
        [
            req(json.dumps(X), "application/json", "a"),
            req(buf.getvalue(), "application/octet-stream", "b"),
            req(np.array(X, dtype="<f4").tobytes(), "application/octet-stream", "c"),
        ]
    )
    assert [r.status for r in outcome.responses] == [200, 200, 200]
    want = expected(tiny_model, X)
    for response in outcome.responses:
        assert response.content_type == "application/json"
        assert body_json(response)["output"] == pytest.approx(want, rel=1e-5)
    assert {"preprocess", "inference", "postprocess", "handler"} <= set(outcome.timings)
    assert service.device == "cpu" and service.model_name == "tiny"
    assert service.model_version == "1.0"


def test_bad_item_fails_only_its_request(torchscript_dir) -> None:
    service = load_service(torchscript_dir(torchbay={"input_shape": [4]}))
    outcome = service.predict(
        [
            req(json.dumps(X), "application/json", "a"),
            req(b"\x00\x01\x02", "application/octet-stream", "b"),
            req("{not json", "application/json", "c"),
            req(json.dumps([1.0, 2.0]), "application/json", "d"),
            req(json.dumps([X, X]), "application/json", "e"),
        ]
    )
    # d: well-formed, but not the manifest's sample shape: the model cannot take it (422).
    assert [r.status for r in outcome.responses] == [200, 400, 400, 422, 200]
    error = body_json(outcome.responses[1])
    assert error["code"] == 400 and error["type"] == "BadInput" and "4 bytes" in error["message"]
    assert body_json(outcome.responses[2])["type"] == "BadInput"
    assert len(body_json(outcome.responses[4])["output"]) == 2  # two samples in one request


def test_shape_header_and_fp16(tmp_path, tiny_model) -> None:
    from .conftest import write_manifest

    torch.jit.trace(tiny_model.half(), torch.ones(1, 1, 4, dtype=torch.float16)).save(
        str(tmp_path / "m.pt")
    )
    write_manifest(tmp_path, serialized="m.pt", handler="tensor", torchbay={"precision": "fp16"})
    service = load_service(tmp_path)
    assert service.handler.model_input_dtype == torch.float16
    raw = np.array(X, dtype="<f4").tobytes()
    outcome = service.predict(
        [req(raw, "application/octet-stream", headers={"x-input-shape": "1,4"})]
    )
    assert outcome.responses[0].status == 200, outcome.responses[0].body
    out = body_json(outcome.responses[0])["output"]
    assert np.array(out).shape == (1, 3)


def test_v2_native(torchscript_dir, tiny_model) -> None:
    service = load_service(torchscript_dir())
    request = {
        "id": "42",
        "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": X + X}],
        "outputs": [{"name": "output0"}],  # no signature: the outputs are output0, output1, ...
    }
    outcome = service.predict(
        [
            req(json.dumps(request), "application/json", protocol="v2"),
            req(b'{"inputs": 3}', "application/json", protocol="v2"),
        ]
    )
    assert [r.status for r in outcome.responses] == [200, 400]
    body = body_json(outcome.responses[0])
    assert body["model_name"] == "tiny" and body["model_version"] == "1.0" and body["id"] == "42"
    [out] = body["outputs"]
    assert out["name"] == "output0" and out["shape"] == [2, 3] and out["datatype"] == "FP32"
    assert out["data"][:3] == pytest.approx(expected(tiny_model, X), rel=1e-5)
    assert "error" in body_json(outcome.responses[1])


class _Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_uint64_past_int64_is_refused_not_wrapped(tmp_path) -> None:
    """UINT64 reaches the model as INT64 (torch has no uint64 arithmetic): 2**64 - 1 came back
    as -1, a 200 with the wrong number. Now a 400 for that request alone; the largest INT64
    still goes through intact."""
    torch.jit.script(_Identity()).save(str(tmp_path / "model.pt"))
    write_manifest(tmp_path, serialized="model.pt", handler="tensor")
    service = load_service(tmp_path)

    def v2(value: int) -> Any:
        tensor = {"name": "x", "shape": [1, 1], "datatype": "UINT64", "data": [value]}
        return req(json.dumps({"inputs": [tensor]}), "application/json", protocol="v2")

    fits, wraps = service.predict([v2(2**63 - 1), v2(2**64 - 1)]).responses
    assert fits.status == 200 and body_json(fits)["outputs"][0]["data"] == [2**63 - 1]
    assert wraps.status == 400
    assert "UINT64 value 18446744073709551615 is past the INT64 range" in body_json(wraps)["error"]


def test_a_scalar_input_to_a_batched_model_is_a_400_naming_it(tmp_path) -> None:
    """Shape [] has no batch dimension to split the answer along: was a 422 "the model cannot
    process this input (IndexError)" with no word of the shape."""
    torch.jit.script(_Identity()).save(str(tmp_path / "model.pt"))
    write_manifest(tmp_path, serialized="model.pt", handler="tensor")
    service = load_service(tmp_path)
    for data in ([5.0], 5.0):
        tensor = {"name": "x", "shape": [], "datatype": "FP32", "data": data}
        body = json.dumps({"inputs": [tensor]})
        [response] = service.predict([req(body, "application/json", protocol="v2")]).responses
        assert response.status == 400, response.body
        assert "v2 input 'x' has shape []" in body_json(response)["error"]


class _Corrid(torch.nn.Module):
    def forward(self, x: torch.Tensor, corrid: torch.Tensor) -> torch.Tensor:
        return corrid


def test_a_uint64_corrid_past_int64_keeps_its_bits(tmp_path) -> None:
    """The sequence control CORRID (TYPE_UINT64) is an id the server fills, not a client's
    value: past INT64 it reaches the model in the INT64 stand-in with its bits kept (2**64 - 1
    as -1), as before the UINT64 check above, never refused."""
    torch.jit.script(_Corrid()).save(str(tmp_path / "model.pt"))
    (tmp_path / "model-config.yaml").write_text(
        "sequence_batching:\n  control_input:\n    - name: CORRID\n"
        "      control: [{kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_UINT64}]\n"
    )
    write_manifest(
        tmp_path, serialized="model.pt", handler="tensor", config_file="model-config.yaml"
    )
    service = load_service(tmp_path)
    tensor = {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}
    request = req(json.dumps({"inputs": [tensor]}), "application/json", protocol="v2")
    request.headers = {"ts_request_sequence_id": str(2**64 - 1)}
    [response] = service.predict([request]).responses
    assert response.status == 200, response.body
    assert body_json(response)["outputs"][0]["data"] == [-1]
