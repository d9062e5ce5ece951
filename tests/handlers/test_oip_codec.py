"""The OIP codec (handlers/runtime/oip*.py) on its own, and through the Service with the tensor
handler: tensor decoding (JSON and binary), every size check, signatures, requested outputs,
classification, and gzip/deflate bodies with their decompression cap."""

from __future__ import annotations

import gzip
import json
import struct
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from torchbay.archiver.signature import Signature, TensorSpec, model_signature
from torchbay.handlers.errors import BadInput, PredictionException
from torchbay.handlers.runtime import oip, oip_binary, oip_encoding, oip_response
from torchbay.handlers.runtime.service import load_service

from .conftest import body_json, req

HEADER = "inference-header-content-length"


def _binary_request(tensors: list[tuple[str, str, list[int], bytes]], extra: bytes = b"") -> Any:
    header = json.dumps(
        {
            "inputs": [
                {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(b)}}
                for n, d, s, b in tensors
            ]
        }
    ).encode()
    body = header + b"".join(b for *_, b in tensors) + extra
    return body, {HEADER: str(len(header))}


# -- JSON tensors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "datatype", "shape", "message"),
    [
        ([[1, 2], [3]], "FP32", [2, 2], "rectangular"),
        ([1.5, 2.0], "INT32", [2], "must be integers"),
        ([300], "UINT8", [1], "out of range"),
        ([-1], "UINT32", [1], "out of range"),
        ([1, 0], "BOOL", [2], "true/false"),
        ([1, 2, 3], "FP32", [2, 2], "3 values do not fill shape [2, 2]"),
        ([1, "a"], "BYTES", [2], "must be strings"),
        (["1"], "FP32", [1], "must be numbers"),
        ([10**400], "INT64", [1], "integers"),
    ],
)
def test_bad_json_data_is_400(data: Any, datatype: str, shape: list[int], message: str) -> None:
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        oip_binary.from_json(data, datatype, shape, "t")


def test_json_data_nested_or_flat_and_fp16_bf16() -> None:
    flat = oip_binary.from_json([1, 2, 3, 4], "FP16", [2, 2], "t")
    nested = oip_binary.from_json([[1, 2], [3, 4]], "FP16", [2, 2], "t")
    assert flat.dtype == np.float16 and np.array_equal(flat, nested)
    bits = oip_binary.from_json([1.0, -2.5, 3.140625], "BF16", [3], "t")
    assert bits.dtype == np.uint16
    assert oip_binary.to_json(bits, "BF16") == [1.0, -2.5, 3.140625]


# -- binary tensors -------------------------------------------------------------------------------


def test_binary_inputs_are_views_of_the_body() -> None:
    a = np.arange(6, dtype="<f4")
    body, headers = _binary_request([("a", "FP32", [2, 3], a.tobytes())])
    request = oip.parse_request(body, headers)
    array = request["inputs"][0]["array"]
    assert array.shape == (2, 3) and np.array_equal(array.reshape(-1), a)
    assert not array.flags.owndata and not array.flags.writeable  # no copy made


@pytest.mark.parametrize(
    ("tensors", "extra", "message"),
    [
        (
            [("a", "FP32", [2], b"\0" * 4)],
            b"",
            "input byte size mismatch for input 'a' .*Expected 8, got 4",
        ),
        ([("a", "FP32", [1], b"\0" * 4)], b"!", "add up to 4"),
        ([("a", "BOOL", [2], b"\x01\x02")], b"", "0 or 1"),
        ([("s", "BYTES", [1], struct.pack("<I", 5) + b"abc")], b"", "runs past"),
        ([("s", "BYTES", [1], struct.pack("<I", 1) + b"ab")], b"", "1 bytes left"),
        ([("s", "BYTES", [2], struct.pack("<I", 1) + b"abcd")], b"", "ends inside element 1"),
        ([("s", "BYTES", [10**12], b"")], b"", "cannot hold 1000000000000 BYTES"),
    ],
)
def test_binary_sizes_are_checked(tensors: list, extra: bytes, message: str) -> None:
    body, headers = _binary_request(tensors, extra)
    with pytest.raises(BadInput, match=message):
        oip.parse_request(body, headers)


def test_binary_bytes_roundtrip_and_mixed_inputs() -> None:
    words = [b"hi", b"", b"\xff\x00"]
    packed = b"".join(struct.pack("<I", len(w)) + w for w in words)
    header = json.dumps(
        {
            "inputs": [
                {"name": "j", "datatype": "INT8", "shape": [2], "data": [1, -2]},
                {"name": "s", "datatype": "BYTES", "shape": [3],
                 "parameters": {"binary_data_size": len(packed)}},
            ]
        }
    ).encode()  # fmt: skip
    request = oip.parse_request(header + packed, {HEADER: str(len(header))})
    assert request["inputs"][0]["array"].tolist() == [1, -2]
    assert request["inputs"][1]["array"].tolist() == words
    assert oip_binary.to_binary(request["inputs"][1]["array"], "BYTES") == packed


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (b'{"inputs": []}', {HEADER: "99"}, "not a length"),
        (b'{"inputs": []}', {HEADER: "-1"}, "not a length"),
        (
            b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1],'
            b' "parameters": {"binary_data_size": 4}}]}abcd',
            {},
            "not valid JSON",
        ),
        (
            b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1],'
            b' "parameters": {"binary_data_size": 0}}]}',
            {},
            "both 'data' and a binary_data_size",
        ),
        (
            b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1],'
            b' "parameters": {"binary_data_size": 4}}]}',
            {},
            "no Inference-Header-Content-Length",
        ),
        (b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1]}]}', {}, "neither 'data'"),
        (
            b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [' + b"1," * 40 + b"1],"
            b' "data": [1]}]}',
            {},
            "at most 32",
        ),
        (
            b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}],'
            b' "outputs": [{"name": "o", "parameters": {"classification": 0}}]}',
            {},
            "classification must be an integer",
        ),
    ],
)
def test_bad_envelopes_are_400(body: bytes, headers: dict[str, str], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        oip.parse_request(body, headers)


# -- signatures -----------------------------------------------------------------------------------


SIGNATURE = model_signature(
    None,
    {
        "inputs": [
            {"name": "a", "datatype": "FP32", "shape": [-1, 2]},
            {"name": "b", "datatype": "INT64", "shape": [-1]},
        ],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
    },
)


def _tensor(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


def test_signature_reorders_inputs_by_name() -> None:
    request = {"inputs": [_tensor("b", "INT64", [3]), _tensor("a", "FP32", [3, 2])]}
    oip.check_signature(request, SIGNATURE)
    assert [t["name"] for t in request["inputs"]] == ["a", "b"]


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        ([_tensor("a", "FP32", [1, 2])], [], "missing input 'b' (INT64, shape [-1])"),
        ([_tensor("a", "FP32", [1, 2]), _tensor("b", "INT64", [1]), _tensor("c", "FP32", [1])],
         [], "unknown input 'c'"),
        ([_tensor("a", "FP64", [1, 2]), _tensor("b", "INT64", [1])], [],
         "input 'a' has datatype FP64; the model expects FP32"),
        ([_tensor("a", "FP32", [1, 3]), _tensor("b", "INT64", [1])], [],
         "input 'a' has shape [1, 3]; the model expects [-1, 2]"),
        ([_tensor("a", "FP32", [1, 2]), _tensor("a", "FP32", [1, 2])], [], "given twice"),
        ([_tensor("a", "FP32", [1, 2]), _tensor("b", "INT64", [1])], [{"name": "z"}],
         "unknown output 'z'"),
    ],
)  # fmt: skip
def test_signature_mismatches_are_400(inputs: list, outputs: list, message: str) -> None:
    with pytest.raises(BadInput) as info:
        oip.check_signature({"inputs": inputs, "outputs": outputs}, SIGNATURE)
    assert message in info.value.message


def test_inputs_the_archiver_named_are_matched_by_position_when_the_names_differ() -> None:
    """``input0``, ``input1`` were made up by the archiver (a tuple example): a request naming
    them otherwise (``input-0``, KServe's TorchServe examples) is matched by position."""
    invented = Signature(
        inputs=[
            TensorSpec(name="input0", datatype="FP32", shape=[-1, 2]),
            TensorSpec(name="input1", datatype="INT64", shape=[-1]),
        ],
        inputs_by_position=True,
    )
    request = {"inputs": [_tensor("input-0", "FP32", [1, 2]), _tensor("ids", "INT64", [1])]}
    oip.check_signature(request, invented)
    assert [t["name"] for t in request["inputs"]] == ["input0", "input1"]
    right = {"inputs": [_tensor("input1", "INT64", [1]), _tensor("input0", "FP32", [1, 2])]}
    oip.check_signature(right, invented)  # the recorded names still match by name, any order
    assert [t["name"] for t in right["inputs"]] == ["input0", "input1"]
    with pytest.raises(BadInput, match="datatype"):  # by position, then checked as ever
        oip.check_signature(
            {"inputs": [_tensor("x", "INT64", [1]), _tensor("y", "FP32", [1, 2])]}, invented
        )
    with pytest.raises(BadInput, match="unknown input 'x'"):  # one short: no guessing
        oip.check_signature({"inputs": [_tensor("x", "FP32", [1, 2])]}, invented)
    with pytest.raises(BadInput, match="unknown input 'x'"):  # declared names: a contract
        oip.check_signature(
            {"inputs": [_tensor("x", "FP32", [1, 2]), _tensor("b", "INT64", [1])]}, SIGNATURE
        )


# -- responses ------------------------------------------------------------------------------------


OUTPUTS = [
    {"name": "p", "datatype": "FP32", "shape": [2], "array": np.array([0.25, 0.75], "<f4")},
    {"name": "q", "datatype": "INT64", "shape": [2], "data": [7, 8]},
]


def test_requested_outputs_order_binary_and_json() -> None:
    request = {
        "outputs": [{"name": "q"}, {"name": "p", "parameters": {"binary_data": True}}],
    }
    body, ctype, headers = oip_response.encode(OUTPUTS, request, {"model_name": "m"})
    assert ctype == "application/octet-stream"
    length = int(headers[HEADER])
    head = json.loads(body[:length])
    assert [o["name"] for o in head["outputs"]] == ["q", "p"]
    assert head["outputs"][0]["data"] == [7, 8]
    assert head["outputs"][1]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(body[length:], "<f4").tolist() == [0.25, 0.75]
    body, ctype, headers = oip_response.encode(OUTPUTS, {}, {"model_name": "m"})
    assert ctype == "application/json" and headers == {}
    assert [o["name"] for o in json.loads(body)["outputs"]] == ["p", "q"]
    with pytest.raises(BadInput, match="unknown output 'r'"):
        oip_response.encode(OUTPUTS, {"outputs": [{"name": "r"}]}, {})


def test_classification_1d_and_labels() -> None:
    values = np.array([0.1, 0.6, 0.3], dtype="<f4")
    out = oip_response.classify(values, "FP32", 5, {"1": ["n01", "tench"]}, "p")
    assert out.tolist() == ["0.600000:1:tench", "0.300000:2", "0.100000:0"]
    with pytest.raises(BadInput, match="cannot be classified"):
        oip_response.classify(np.array(["x"], dtype=object), "BYTES", 1, None, "s")


@pytest.mark.parametrize(
    ("values", "datatype", "expected"),
    [
        ([[3, -7, 9]], "INT32", [["9:2", "3:0", "-7:1"]]),
        ([[0, 255, 7]], "UINT8", [["255:1", "7:2", "0:0"]]),
        ([[2**63 - 1, 2**63 - 2, -(2**63)]], "INT64", [[f"{2**63 - 1}:0", f"{2**63 - 2}:1"]]),
        ([[2**64 - 1, 0, 2**63]], "UINT64", [[f"{2**64 - 1}:0", f"{2**63}:2"]]),
    ],
)
def test_classification_of_integers_writes_the_integer(values, datatype, expected) -> None:
    """Triton writes an integer output's value with std::to_string of its type ("9:2"; it
    was "9.000000:2"), and an int64 past 2**53 exactly (it was rounded through a double, and
    2**63 - 1 and 2**63 - 2 tied)."""
    array = np.array(values, dtype=oip_binary.NUMPY_DTYPES[datatype])
    k = len(expected[0])
    assert oip_response.classify(array, datatype, k, None, "o").tolist() == expected


# -- content encodings ----------------------------------------------------------------------------


def test_gzip_deflate_and_raw_deflate_bodies() -> None:
    raw = b'{"x": 1}' * 100
    assert oip_encoding.decode_content(gzip.compress(raw), "gzip", 10_000) == raw
    assert oip_encoding.decode_content(zlib.compress(raw), "deflate", 10_000) == raw
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    bare = compressor.compress(raw) + compressor.flush()
    assert oip_encoding.decode_content(bare, "Deflate", 10_000) == raw
    assert oip_encoding.decode_content(raw, "identity", 10) == raw
    assert oip_encoding.decode_content(raw, None, 10) == raw


@pytest.mark.parametrize(
    ("body", "coding", "status"),
    [
        (b"not gzip", "gzip", 400),
        (gzip.compress(b"x" * 100, mtime=0)[:-12], "gzip", 400),  # truncated
        (gzip.compress(b"x", mtime=0) + b"junk", "gzip", 400),
        (b"x", "br", 415),
        (gzip.compress(b"x" * 101, mtime=0), "gzip", 413),
    ],
    # Named, not by their bytes: test processes must collect the same ids.
    ids=["not-gzip", "truncated", "trailing-junk", "brotli", "over-the-cap"],
)
def test_bad_or_oversized_compressed_bodies(body: bytes, coding: str, status: int) -> None:
    with pytest.raises(PredictionException) as info:
        oip_encoding.decode_content(body, coding, 100)
    assert info.value.error_code == status


def test_exactly_the_cap_inflates() -> None:
    assert len(oip_encoding.decode_content(gzip.compress(b"y" * 100), "gzip", 100)) == 100


def test_a_bomb_never_allocates_past_the_cap() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    bomb = b"".join(compressor.compress(zeros) for _ in range(64)) + compressor.flush()
    cap = 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(PredictionException) as info:
            oip_encoding.decode_content(bomb, "gzip", cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.error_code == 413
    assert peak < 3 * cap  # 64 MiB inflated would be; the cap plus one chunk is what it holds


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        ("gzip, deflate, br", "gzip"),
        ("deflate", "deflate"),
        ("gzip;q=0, deflate;q=0.5", "deflate"),
        ("br", None),
        ("*", "gzip"),
        ("", None),
        (None, None),
        ("gzip;q=nope", None),
    ],
)
def test_accept_encoding(accept: str | None, coding: str | None) -> None:
    assert oip_encoding.pick_encoding(accept) == coding


# -- through the Service and the tensor handler ---------------------------------------------------


X = [1.0, 2.0, 0.5, -3.0]  # exact in bfloat16


def test_bf16_binary_input_reaches_the_model(torchscript_dir: Any, tiny_model: Any) -> None:
    service = load_service(torchscript_dir())
    bits = oip_binary.bf16_bits(np.array([X], dtype=np.float32))
    body, headers = _binary_request([("x", "BF16", [1, 4], bits.tobytes())])
    [response] = service.predict([req(body, protocol="v2", headers=headers)]).responses
    assert response.status == 200, response.body
    [out] = body_json(response)["outputs"]
    with torch.no_grad():
        want = tiny_model(torch.tensor([X])).tolist()[0]
    assert out["name"] == "output0" and out["data"] == pytest.approx(want)


def test_unknown_output_without_a_signature_is_400(torchscript_dir: Any) -> None:
    service = load_service(torchscript_dir())
    request = {
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X}],
        "outputs": [{"name": "output1"}],
    }
    [response] = service.predict([req(json.dumps(request), protocol="v2")]).responses
    assert response.status == 400
    assert "unknown output 'output1'" in body_json(response)["error"]


def test_an_input_given_twice_without_a_signature_is_400(torchscript_dir: Any) -> None:
    """Was a 422 "the model cannot process this input (RuntimeError)": both went to forward."""
    service = load_service(torchscript_dir())
    x = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X}
    [response] = service.predict([req(json.dumps({"inputs": [x, x]}), protocol="v2")]).responses
    assert response.status == 400
    assert body_json(response)["error"] == "input 'x' is given twice"


def test_signature_from_model_config_yaml(torchscript_dir: Any, tmp_path: Path) -> None:
    model_dir = torchscript_dir(config_file="model-config.yaml")
    (model_dir / "model-config.yaml").write_text(
        "inputs: [{name: features, datatype: FP32, shape: [-1, 4]}]\n"
        "outputs: [{name: logits, datatype: FP32, shape: [-1, 3]}]\n"
    )
    service = load_service(model_dir)
    good = {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": X}]}
    bad = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X}]}
    outcome = service.predict([req(json.dumps(b), protocol="v2") for b in (good, bad)])
    assert [r.status for r in outcome.responses] == [200, 400]
    assert body_json(outcome.responses[0])["outputs"][0]["name"] == "logits"
    assert "unknown input 'x'" in body_json(outcome.responses[1])["error"]


def test_compressed_predict_and_v2_bodies(torchscript_dir: Any) -> None:
    service = load_service(torchscript_dir())
    v2 = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X}]})
    requests = [
        req(gzip.compress(json.dumps(X).encode()), "application/json",
            headers={"content-encoding": "gzip"}),
        req(gzip.compress(b" " * 7_000_000), "application/json",
            headers={"content-encoding": "gzip"}),
        req(zlib.compress(v2.encode()), protocol="v2",
            headers={"content-encoding": "deflate", "accept-encoding": "gzip"}),
    ]  # fmt: skip
    responses = service.predict(requests).responses
    assert [r.status for r in responses] == [200, 413, 200]
    assert len(body_json(responses[0])["output"]) == 3
    assert responses[2].headers["content-encoding"] == "gzip"
    assert len(json.loads(gzip.decompress(responses[2].body))["outputs"][0]["data"]) == 3


def test_preprocessing_handlers_skip_the_recorded_signature(torchscript_dir: Any) -> None:
    # a handler that does not speak v2 natively takes e.g. BYTES image data: the model's recorded
    # tensors (input0 FP32 [-1, 4]) do not describe its requests; model-config.yaml would
    recorded = {"input_shape": [4]}
    assert load_service(torchscript_dir(torchbay=recorded)).signature is not None
    service = load_service(torchscript_dir("image_classifier", torchbay=recorded))
    assert service.signature is None
    model_dir = torchscript_dir("image_classifier", torchbay=recorded, config_file="c.yaml")
    (model_dir / "c.yaml").write_text("inputs: [{name: data, datatype: BYTES, shape: [1]}]\n")
    assert [s.name for s in load_service(model_dir).signature.inputs] == ["data"]
