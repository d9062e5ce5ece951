"""The Open Inference Protocol data plane on a live server, with real clients: tritonclient.http
(binary tensor data by default, and JSON), the KServe SDK (in a child process) and raw HTTP.

Models are built here: ``sub`` (TorchScript ``forward(a, b) -> a - b``, so the input order
matters), ``pair`` (two outputs), ``scores`` (identity logits with index_to_name.json labels, for
classification), ``half`` (FP16 in and out) and ``echo`` (a function handler: BYTES in and out).
Their signatures come from model-config.yaml ``inputs``/``outputs``.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from torchbay.archiver.package import ArchiveOptions, package

from .conftest import LiveServer, running

CLIENTS = Path(__file__).parents[1] / "clients"


class Sub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a - b


class Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x + 1


class Scores(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Half(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).half()


ECHO_HANDLER = """
def handle(data, context):
    if data is None:
        return None
    out = []
    for row in data:
        body = row.get("body")
        if isinstance(body, (bytes, bytearray)):
            body = bytes(body).decode()
        out.append(body.upper() if isinstance(body, str) else body)
    return out
"""


def _spec(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


MODELS: dict[str, tuple[torch.nn.Module | None, dict[str, Any]]] = {
    "sub": (
        Sub(),
        {
            "inputs": [_spec("a", "FP32", [-1, 3]), _spec("b", "FP32", [-1, 3])],
            "outputs": [_spec("diff", "FP32", [-1, 3])],
        },
    ),
    "pair": (
        Pair(),
        {
            "inputs": [_spec("x", "FP32", [-1, 2])],
            "outputs": [_spec("double", "FP32", [-1, 2]), _spec("plus", "FP32", [-1, 2])],
        },
    ),
    "scores": (
        Scores(),
        {"inputs": [_spec("x", "FP32", [-1, 4])], "outputs": [_spec("probs", "FP32", [-1, 4])]},
    ),
    "half": (
        Half(),
        {"inputs": [_spec("x", "FP16", [-1, 2])], "outputs": [_spec("y", "FP16", [-1, 2])]},
    ),
    "echo": (
        None,
        {"inputs": [_spec("text", "BYTES", [1])], "outputs": [_spec("upper", "BYTES", [1])]},
    ),
}


def _build(name: str, root: Path, work: Path) -> None:
    model, signature = MODELS[name]
    config = work / f"{name}-config.yaml"
    config.write_text(json.dumps(signature))  # JSON is YAML
    options: dict[str, Any] = {"config_file": config}
    if model is None:
        handler = work / "echo_handler.py"
        handler.write_text(ECHO_HANDLER)
        options["handler"] = str(handler)
    else:
        serialized = work / f"{name}.pt"
        torch.jit.save(torch.jit.script(model.eval()), str(serialized))
        options.update(handler="tensor", serialized_file=serialized)
    if name == "scores":
        labels = work / "index_to_name.json"
        labels.write_text(json.dumps({"0": "cat", "1": "dog", "2": "eel", "3": "fox"}))
        options["extra_files"] = (str(labels),)
    package(ArchiveOptions(model_name=name, version="1", export_path=root, **options))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("oip-store")
    work = tmp_path_factory.mktemp("oip-build")
    for name in MODELS:
        _build(name, root, work)
    with running(root, load_models=["all"]) as live:
        yield live


def _input(name: str, array: np.ndarray, datatype: str, binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


A = np.array([[5.0, 7.0, 9.0]], dtype=np.float32)
B = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)


def sub_inputs(module: Any, a: np.ndarray = A, b: np.ndarray = B) -> list[Any]:
    """``Sub``'s two FP32 inputs as tritonclient's ``module`` (http or grpc) builds them."""
    inputs = []
    for name, array in (("a", a), ("b", b)):
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


# -- inputs by name, in either order ------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("order", ["ab", "ba"])
def test_inputs_are_matched_by_name(oip_http: Any, binary: bool, order: str) -> None:
    inputs = {"a": _input("a", A, "FP32", binary), "b": _input("b", B, "FP32", binary)}
    result = oip_http.infer("sub", [inputs[k] for k in order])
    np.testing.assert_array_equal(result.as_numpy("diff"), A - B)
    assert result.get_output("diff")["datatype"] == "FP32"


def test_binary_and_json_inputs_mixed(oip_http: Any) -> None:
    inputs = [_input("b", B, "FP32", binary=True), _input("a", A, "FP32", binary=False)]
    outputs = [triton.InferRequestedOutput("diff", binary_data=False)]
    result = oip_http.infer("sub", inputs, outputs=outputs)
    assert result.get_output("diff")["data"] == (A - B).reshape(-1).tolist()


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([("a", A, "FP32")], "missing input 'b'"),
        ([("a", A, "FP32"), ("b", B, "FP32"), ("c", B, "FP32")], "unknown input 'c'"),
        ([("a", A, "FP32"), ("b", B.astype(np.int64), "INT64")], "the model expects FP32"),
        ([("a", A, "FP32"), ("b", np.ones((1, 4), np.float32), "FP32")], "expects [-1, 3]"),
    ],
    ids=["missing", "unknown", "dtype", "shape"],
)
def test_bad_inputs_are_400_naming_the_tensor(oip_http: Any, inputs: list, message: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        oip_http.infer("sub", [_input(n, a, d) for n, a, d in inputs])
    assert info.value.status() == "400"
    assert message in info.value.message()


# -- requested outputs ---------------------------------------------------------------------------


X2 = np.array([[1.0, 2.0]], dtype=np.float32)
_X2_JSON = {"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}


@pytest.mark.parametrize("binary", [True, False])
def test_requested_outputs_subset_and_order(oip_http: Any, binary: bool) -> None:
    plus = [triton.InferRequestedOutput("plus", binary_data=binary)]
    result = oip_http.infer("pair", [_input("x", X2, "FP32")], outputs=plus)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["plus"]
    np.testing.assert_array_equal(result.as_numpy("plus"), X2 + 1)
    both = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("plus", "double")]
    result = oip_http.infer("pair", [_input("x", X2, "FP32")], outputs=both)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["plus", "double"]
    np.testing.assert_array_equal(result.as_numpy("plus"), X2 + 1)
    np.testing.assert_array_equal(result.as_numpy("double"), X2 * 2)


def test_all_outputs_named_by_the_signature(oip_http: Any) -> None:
    result = oip_http.infer("pair", [_input("x", X2, "FP32")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["double", "plus"]
    np.testing.assert_array_equal(result.as_numpy("double"), X2 * 2)


def test_unknown_output_is_400(oip_http: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        outputs = [triton.InferRequestedOutput("nope")]
        oip_http.infer("pair", [_input("x", X2, "FP32")], outputs=outputs)
    assert info.value.status() == "400" and "unknown output 'nope'" in info.value.message()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parameters": {"binary_data_output": "yes"}}, "Unable to parse 'binary_data_output'"),
        ({"outputs": [{"name": "plus", "parameters": {"binary_data": 1}}]}, "'binary_data'"),
        ({"inputs": [{**_X2_JSON, "shape": [1 << 62, 0], "data": []}]}, "larger than a tensor"),
        ({"inputs": [{**_X2_JSON, "shape": [1 << 64, 0], "data": []}]}, "larger than a tensor"),
    ],
    ids=["binary_data_output", "binary_data", "huge-empty", "past-int64-empty"],
)
def test_bad_request_fields_are_400s_naming_them(server: LiveServer, change, message) -> None:
    """As Triton: a flag that is not a boolean is refused, not taken for false; a shape numpy
    cannot hold is the request's 400 (it was the decoder's "cannot be decoded (ValueError)")."""
    body = {"inputs": [_X2_JSON], **change}
    r = httpx.post(f"{server.url}/v2/models/pair/infer", json=body)
    assert r.status_code == 400 and message in r.json()["error"], r.text


# -- datatypes, classification -------------------------------------------------------------------


def test_fp16_in_and_out(oip_http: Any) -> None:
    x = np.array([[1.5, -2.25]], dtype=np.float16)
    result = oip_http.infer("half", [_input("x", x, "FP16")])
    assert result.get_output("y")["datatype"] == "FP16"
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_in_and_out(oip_http: Any, binary: bool) -> None:
    text = np.array([b"hello"], dtype=np.object_)
    outputs = [triton.InferRequestedOutput("upper", binary_data=binary)]
    result = oip_http.infer("echo", [_input("text", text, "BYTES", binary)], outputs=outputs)
    assert result.get_output("upper")["datatype"] == "BYTES"
    [value] = result.as_numpy("upper").tolist()
    assert value == (b"HELLO" if binary else "HELLO")  # tritonclient: JSON strings stay str
    result = oip_http.infer("echo", [_input("text", text, "BYTES", binary)])  # all outputs
    assert [o["name"] for o in result.get_response()["outputs"]] == ["upper"]


def test_classification_top_k_with_labels(oip_http: Any) -> None:
    x = np.array([[0.1, 0.7, 0.05, 0.15], [0.5, 0.2, 0.3, 0.0]], dtype=np.float32)
    outputs = [triton.InferRequestedOutput("probs", binary_data=True, class_count=2)]
    result = oip_http.infer("scores", [_input("x", x, "FP32")], outputs=outputs)
    assert result.as_numpy("probs").tolist() == [
        [b"0.700000:1:dog", b"0.150000:3:fox"],
        [b"0.500000:0:cat", b"0.300000:2:eel"],
    ]


# -- content encodings ---------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(oip_http: Any, algorithm: str) -> None:
    inputs = [_input("a", A, "FP32"), _input("b", B, "FP32")]
    result = oip_http.infer(
        "sub",
        inputs,
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("diff"), A - B)


def _raw_body(a: np.ndarray, b: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {"name": "a", "shape": [1, 3], "datatype": "FP32",
                 "parameters": {"binary_data_size": a.nbytes}},
                {"name": "b", "shape": [1, 3], "datatype": "FP32",
                 "parameters": {"binary_data_size": b.nbytes}},
            ],
            "outputs": [{"name": "diff", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    return header + a.tobytes() + b.tobytes(), {"inference-header-content-length": str(len(header))}


def test_raw_binary_response_layout(server: LiveServer) -> None:
    body, headers = _raw_body(A, B)
    r = httpx.post(
        f"{server.url}/v2/models/sub/infer",
        content=body,
        headers={**headers, "accept-encoding": "identity"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    length = int(r.headers["inference-header-content-length"])
    head = json.loads(r.content[:length])
    [out] = head["outputs"]
    assert out["parameters"] == {"binary_data_size": 12} and "data" not in out
    assert np.frombuffer(r.content[length:], dtype="<f4").tolist() == (A - B)[0].tolist()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda body, h: (body + b"x", h), "add up to"),
        (lambda body, h: (body[:-1], h), "runs past the end"),
        (lambda body, h: (body, {"inference-header-content-length": "nope"}), "not a length"),
        (lambda body, h: (body, {}), "not valid JSON"),
    ],
    ids=["extra-byte", "short", "bad-header", "no-header"],
)
def test_binary_sizes_are_checked(server: LiveServer, mutate: Any, message: str) -> None:
    body, headers = mutate(*_raw_body(A, B))
    r = httpx.post(f"{server.url}/v2/models/sub/infer", content=body, headers=headers)
    assert r.status_code == 400 and message in r.json()["error"]


def test_decompression_bomb_is_413(server: LiveServer) -> None:
    bomb = gzip.compress(b" " * (8 << 20))  # inflates past the default 6553500-byte cap
    r = httpx.post(
        f"{server.url}/v2/models/sub/infer",
        content=bomb,
        headers={"content-encoding": "gzip"},
    )
    assert r.status_code == 413 and "larger than 6553500" in r.json()["error"]
    ok = zlib.compress(json.dumps({"inputs": [
        {"name": "a", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
        {"name": "b", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]},
    ]}).encode())  # fmt: skip
    r = httpx.post(
        f"{server.url}/v2/models/sub/infer", content=ok, headers={"content-encoding": "deflate"}
    )
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [0, 1, 2]


# -- the KServe SDK, in a child process ---------------------------------------------------------


def test_kserve_rest_client(server: LiveServer) -> None:
    args = [sys.executable, str(CLIENTS / "kserve_rest.py"), server.url, "sub"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    want = [{"name": "diff", "datatype": "FP32", "data": [4.0, 5.0, 6.0]}]
    assert result == {"binary": want, "json": want}


# -- error shape on every v2 path -----------------------------------------------------------------


def test_v2_errors_carry_the_error_field(server: LiveServer) -> None:
    missing = httpx.post(f"{server.url}/v2/models/nope/infer", json={"inputs": []})
    assert missing.status_code == 404 and isinstance(missing.json()["error"], str)
    huge = httpx.post(f"{server.url}/v2/models/sub/infer", content=b" " * 6_600_000)
    assert huge.status_code == 413 and isinstance(huge.json()["error"], str)
    bad = httpx.post(f"{server.url}/v2/models/sub/infer", content=b"{")
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]
    ready = httpx.get(f"{server.url}/v2/models/nope/ready")
    assert ready.status_code == 404 and isinstance(ready.json()["error"], str)
    for r in (missing, huge, bad, ready):
        assert "Traceback" not in r.text and "/tmp" not in r.text


def test_id_is_echoed_and_json_response_is_json(server: LiveServer) -> None:
    body = {
        "id": "req-7",
        "inputs": [
            {"name": "b", "shape": [1, 3], "datatype": "FP32", "data": [[1, 2, 3]]},
            {"name": "a", "shape": [1, 3], "datatype": "FP32", "data": [[5, 7, 9]]},
        ],
    }
    r = httpx.post(f"{server.url}/v2/models/sub/infer", json=body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    head = r.json()
    assert head["id"] == "req-7" and head["model_name"] == "sub" and head["model_version"] == "1"
    assert head["outputs"] == [{"name": "diff", "datatype": "FP32", "shape": [1, 3],
                                "data": [4.0, 5.0, 6.0]}]  # fmt: skip
