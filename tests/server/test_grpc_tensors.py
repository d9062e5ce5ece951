"""ModelInfer <-> the binary tensor data extension body (server/grpc/tensors.py), on their own."""

from __future__ import annotations

import json
import struct

import pytest

from torchbay.server.errors import BadRequest, HandlerFailed
from torchbay.server.grpc import tensors
from torchbay.server.grpc.messages import message


def _request(**kwargs):
    return message("inference.ModelInferRequest")(**kwargs)


def _split(body: bytes, head_len: int) -> tuple[dict, bytes]:
    return json.loads(body[:head_len]), body[head_len:]


def test_raw_inputs_become_the_binary_body_and_every_output_is_asked_binary() -> None:
    request = _request(model_name="m", id="req-7")
    a = request.inputs.add(name="a", datatype="FP32", shape=[1, 2])
    a.parameters["note"].string_param = "x"
    request.inputs.add(name="b", datatype="INT8", shape=[3])
    request.outputs.add(name="out")
    request.parameters["priority"].int64_param = 3
    request.raw_input_contents.extend([struct.pack("<2f", 1.5, -2.0), b"\x01\x02\x03"])
    body, head_len = tensors.request_body(request)
    header, raw = _split(body, head_len)
    assert header["id"] == "req-7"
    assert header["parameters"] == {"priority": 3, "binary_data_output": True}
    assert header["inputs"] == [
        {"name": "a", "datatype": "FP32", "shape": [1, 2],
         "parameters": {"note": "x", "binary_data_size": 8}},
        {"name": "b", "datatype": "INT8", "shape": [3], "parameters": {"binary_data_size": 3}},
    ]  # fmt: skip
    assert header["outputs"] == [{"name": "out", "parameters": {"binary_data": True}}]
    assert raw == struct.pack("<2f", 1.5, -2.0) + b"\x01\x02\x03"


def test_typed_contents_pack_to_the_same_raw_layout() -> None:
    request = _request(model_name="m")
    for name, dtype, field, values in [
        ("f", "FP32", "fp32_contents", [1.0, 2.5]),
        ("i", "INT16", "int_contents", [-1, 300]),
        ("u", "UINT64", "uint64_contents", [2**63]),
        ("t", "BOOL", "bool_contents", [True, False]),
        ("s", "BYTES", "bytes_contents", [b"ab", b""]),
    ]:
        tensor = request.inputs.add(name=name, datatype=dtype, shape=[len(values)])
        getattr(tensor.contents, field).extend(values)
    body, head_len = tensors.request_body(request)
    header, raw = _split(body, head_len)
    expected = [
        struct.pack("<2f", 1.0, 2.5),
        struct.pack("<2h", -1, 300),
        struct.pack("<Q", 2**63),
        b"\x01\x00",
        struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0),
    ]
    assert [i["parameters"]["binary_data_size"] for i in header["inputs"]] == [
        len(e) for e in expected
    ]
    assert raw == b"".join(expected)


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda r: r.raw_input_contents.append(b"x"), "1 entries for 0 inputs"),
        (lambda r: r.inputs.add(name="h", datatype="FP16", shape=[1]), "needs raw_input_contents"),
        (lambda r: r.inputs.add(name="q", datatype="NOPE", shape=[1]), "needs raw_input_contents"),
        (
            lambda r: r.inputs.add(
                name="x", datatype="INT8", shape=[1]
            ).contents.int_contents.append(300),
            "do not fit datatype INT8",
        ),
        # The values in another datatype's field: was packed as no values, and the worker's
        # 400 spoke of a "binary_data_size 0" the client never sent.
        (
            lambda r: r.inputs.add(
                name="x", datatype="FP32", shape=[2]
            ).contents.int_contents.extend([1, 2]),
            r"a FP32 input's values go in contents.fp32_contents \(or raw_input_contents\), "
            "not contents.int_contents",
        ),
        (
            lambda r: r.inputs.add(
                name="x", datatype="FP32", shape=[1, 3]
            ).contents.fp32_contents.extend([1, 2]),
            r"input 'x': shape \[1, 3\] holds 3 values; contents.fp32_contents has 2",
        ),
        (
            lambda r: r.inputs.add(name="x", datatype="INT64", shape=[2]),
            r"shape \[2\] holds 2 values; contents.int64_contents has 0",
        ),
    ],
)
def test_inputs_that_cannot_be_sent_are_bad_requests_naming_the_problem(build, words) -> None:
    request = _request(model_name="m")
    build(request)
    with pytest.raises(BadRequest, match=words):
        tensors.request_body(request)


def test_raw_and_typed_contents_together_are_refused() -> None:
    request = _request(model_name="m")
    request.inputs.add(name="x", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    request.raw_input_contents.append(b"\x00" * 4)
    with pytest.raises(BadRequest) as refused:
        tensors.request_body(request)
    assert refused.value.message == (  # Triton's words
        "contents field must not be specified when using raw_input_contents for 'x' for model 'm'"
    )


def _binary_response(outputs: list[dict], raws: list[bytes], **extra) -> tuple[bytes, dict]:
    head = json.dumps({"model_name": "m", "model_version": "2", "id": "r", "outputs": outputs,
                       **extra}).encode()  # fmt: skip
    return head + b"".join(raws), {"Inference-Header-Content-Length": str(len(head))}


def test_binary_answer_becomes_raw_output_contents() -> None:
    raws = [struct.pack("<3f", 1, 2, 3), struct.pack("<I", 2) + b"hi"]
    body, headers = _binary_response(
        [
            {"name": "y", "datatype": "FP32", "shape": [1, 3],
             "parameters": {"binary_data_size": 12}},
            {"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}},
        ],
        raws,
        parameters={"sequence_end": True},
    )  # fmt: skip
    response = tensors.infer_response(body, headers, "asked", "")
    assert (response.model_name, response.model_version, response.id) == ("m", "2", "r")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("y", "FP32", [1, 3]), ("s", "BYTES", [1])
    ]  # fmt: skip
    assert list(response.raw_output_contents) == raws
    assert response.parameters["sequence_end"].bool_param is True
    assert "binary_data_size" not in response.outputs[0].parameters


def test_json_data_outputs_are_packed_raw_too() -> None:
    body = json.dumps({"outputs": [{"name": "y", "datatype": "INT64", "shape": [2, 2],
                                    "data": [[1, 2], [3, -4]]}]}).encode()  # fmt: skip
    response = tensors.infer_response(body, {}, "m", "1")
    assert (response.model_name, response.model_version) == ("m", "1")
    assert list(response.raw_output_contents) == [struct.pack("<4q", 1, 2, 3, -4)]


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"not json", {}),
        (b"{}", {"inference-header-content-length": "99"}),
        (
            json.dumps(
                {
                    "outputs": [
                        {
                            "name": "y",
                            "datatype": "FP32",
                            "shape": [1],
                            "parameters": {"binary_data_size": 4},
                        }
                    ]
                }
            ).encode(),
            {},
        ),
    ],
)
def test_a_malformed_answer_is_a_handler_failure(body: bytes, headers: dict) -> None:
    with pytest.raises(HandlerFailed, match="malformed"):
        tensors.infer_response(body, headers, "m", "1")
