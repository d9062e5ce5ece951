"""One request never fails another, nor the worker: decoder limits, bisect, status classes,
scrubbed messages, validated response headers and NaN as null (through ``Service.predict``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from torchbay.handlers.errors import BadInput, failure_message, scrub_message
from torchbay.handlers.runtime.envelopes import MAX_JSON_DEPTH, decode_json, flatten, json_depth
from torchbay.handlers.runtime.service import load_service
from torchbay.server.serving import protocol as p
from torchbay.server.serving import transport
from torchbay.server.worker.main import _predict

from .conftest import body_json, req, write_manifest

X = [1.0, 2.0, 3.0, 4.0]

POISON_HANDLER = '''
import json
import math
import sys


class Poison:
    """Echoes each row's JSON body; magic keys misbehave for that row only."""

    def initialize(self, context):
        self.calls = []

    def handle(self, data, context):
        self.calls.append(len(data))
        out = []
        for i, row in enumerate(data):
            body = row.get("body")
            if isinstance(body, str) and body.startswith("{"):  # a v2 BYTES input
                body = json.loads(body)
            body = body if isinstance(body, dict) else {"raw": str(body)}
            if body.get("raise") == "runtime":
                raise RuntimeError("secret at /srv/models/p.py\\nTraceback (most recent call last)")
            if body.get("raise") == "exit":
                sys.exit(3)
            if body.get("raise") == "prediction":
                raise PredictionException(body.get("message", "nope"), body.get("code", 418))
            if "status" in body:
                context.set_response_status(body["status"], "asked", i)
            if "header" in body:
                name, value = body["header"]
                context.set_response_header(i, name, value)
            if body.get("nan"):
                out.append({"values": [math.nan, math.inf, -math.inf, 1.5]})
                continue
            out.append({"echo": body.get("echo"), "batch": len(data)})
        return out


from ts.utils.util import PredictionException  # noqa: E402
'''


@pytest.fixture
def poison_dir(tmp_path: Path) -> Path:
    (tmp_path / "poison.py").write_text(POISON_HANDLER)
    write_manifest(tmp_path, serialized=None, handler="poison.py")
    return tmp_path


def _json(value: Any, rid: str = "r") -> Any:
    return req(json.dumps(value), "application/json", rid)


def _assert_clean(body: bytes) -> None:
    text = body.decode()
    json.loads(text)  # valid JSON
    for leak in ("Traceback", 'File "', "/tmp", "/work", "/srv", ".py"):
        assert leak not in text, text


# -- decoder limits ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"[1, 2, 3]", 0),  # few openers: no scan needed
        (b"[" * 200 + b"]" * 200, 200),
        (b'["' + b"[" * 300 + b'"]', 1),  # brackets inside a string do not count
        (b'["\\"' + b"[" * 300 + b'"]', 1),  # nor after an escaped quote
        (b'["]]]]]]]",' + b"[" * 200 + b"]" * 200 + b"]", 201),
        (b'{"a":' * 150 + b"1" + b"}" * 150, 150),
    ],
)
def test_json_depth(body: bytes, depth: int) -> None:
    assert json_depth(body) == depth


def test_deep_json_is_400_before_json_recursion() -> None:
    with pytest.raises(BadInput, match=f"deeper than {MAX_JSON_DEPTH}"):
        decode_json(b"[" * 100_000 + b"]" * 100_000)
    assert decode_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH) is not None


def test_flatten_does_not_recurse() -> None:
    deep: Any = [7]
    for _ in range(10_000):
        deep = [deep, 1]
    flat = flatten(deep)
    assert flat[0] == 7 and len(flat) == 10_001
    assert flatten([[1, [2, 3]], [], [[4]], 5]) == [1, 2, 3, 4, 5]


V2_OK = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"datatype": ["FP32"]}, "datatype"),
        ({"datatype": "FLOAT"}, "datatype"),
        ({"name": 3}, "name"),
        ({"shape": [1, True, 4]}, "shape"),
        ({"shape": [-1, 4]}, "shape"),
        ({"shape": "1,4"}, "shape"),
        ({"data": {"a": 1}}, "data"),
        ({"parameters": [1]}, "parameters"),
    ],
)
def test_v2_fields_are_validated(poison_dir: Path, change: dict[str, Any], field: str) -> None:
    bad = {"inputs": [{**V2_OK, **change}]}
    good = {"inputs": [V2_OK]}
    service = load_service(poison_dir)
    outcome = service.predict(
        [req(json.dumps(bad), protocol="v2"), req(json.dumps(good), protocol="v2")]
    )
    assert [r.status for r in outcome.responses] == [400, 200]
    assert field in body_json(outcome.responses[0])["message"]


@pytest.mark.parametrize(
    "request_",
    [
        {"inputs": [V2_OK], "outputs": [{"name": 1}]},
        {"inputs": [V2_OK], "outputs": ["y"]},
        {"inputs": [V2_OK], "id": 5},
        {"inputs": [V2_OK], "parameters": "x"},
    ],
)
def test_v2_request_fields_are_validated(poison_dir: Path, request_: dict[str, Any]) -> None:
    outcome = load_service(poison_dir).predict([req(json.dumps(request_), protocol="v2")])
    assert outcome.responses[0].status == 400


def test_undecodable_requests_fail_alone(poison_dir: Path) -> None:
    service = load_service(poison_dir)
    deep = b"[" * 100_000 + b"]" * 100_000
    outcome = service.predict(
        [
            req(deep, "application/json", "deep"),
            req(b'{"inputs": ' + deep + b"}", protocol="v2"),
            req(b"\xff\xfe{", "application/json", "bytes"),
            req(b"--x\r\nbroken", "multipart/form-data; boundary=x", "multipart"),
            req(b"abc", "text/plain; charset=no-such-charset", "charset"),
            _json({"echo": 1}, "good"),
        ]
    )
    # A body labelled JSON or text that does not decode reaches the handler raw, as on
    # TorchServe 0.12 (its own handlers answer it 400: test_classifiers); a v2 body or a
    # malformed multipart one is answered 400 before the handler runs.
    assert [r.status for r in outcome.responses] == [200, 400, 200, 400, 200, 200]
    assert body_json(outcome.responses[5]) == {"echo": 1, "batch": 4}
    for response in outcome.responses:
        _assert_clean(response.body)


# -- the scrubber ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "want"),
    [
        ("plain words", "plain words"),
        ('bad\nTraceback (most recent call last):\n  File "/a/b.py", line 1', "bad"),
        (
            "The following operation failed in the TorchScript interpreter.\n"
            'Traceback of TorchScript (most recent call last):\n  File "code/x.py", line 3',
            "The following operation failed in the TorchScript interpreter.",
        ),
        ("cannot open /work/wt/model.pt now", "cannot open <path> now"),
        ("see /tmp/x and /model.pt", "see <path> and <path>"),
        ("file:///etc/passwd", "<path>"),
        ("C:\\Users\\me\\m.pt failed", "<path> failed"),
        ("shapes (1x32 and 64x32) and 3/4", "shapes (1x32 and 64x32) and 3/4"),
        ("Traceback (most recent call last):\n  File", "(details withheld; see the worker log)"),
    ],
)
def test_scrub_message(message: str, want: str) -> None:
    assert scrub_message(message) == want


def test_scrub_caps_the_length_and_failure_message_names_type_and_id() -> None:
    assert len(scrub_message("x" * 5000)) == 1000
    message = failure_message(KeyError("/secret/path.py"), ["id-1"])
    assert message == "The handler failed on this request (KeyError); request id id-1"


# -- bisect ------------------------------------------------------------------------------------


def test_a_raising_input_fails_alone_and_its_mates_are_answered(poison_dir: Path) -> None:
    service = load_service(poison_dir)
    requests = [_json({"echo": i}, f"g{i}") for i in range(6)]
    requests.insert(3, _json({"raise": "runtime"}, "poison"))
    outcome = service.predict(requests)
    statuses = [r.status for r in outcome.responses]
    assert statuses == [200, 200, 200, 500, 200, 200, 200]
    echoes = [body_json(r).get("echo") for r in outcome.responses]
    assert echoes[:3] + echoes[4:] == [0, 1, 2, 3, 4, 5]
    error = body_json(outcome.responses[3])
    assert error == {
        "code": 500,
        "type": "RuntimeError",
        "message": "The handler failed on this request (RuntimeError); request id poison",
    }
    calls = service.handler.calls
    assert calls[0] == 7 and len(calls) > 1 and 1 in calls  # bisected down to one request
    assert outcome.timings["handler"] > 0


def test_a_handler_calling_sys_exit_fails_its_request_only(poison_dir: Path) -> None:
    outcome = load_service(poison_dir).predict(
        [_json({"raise": "exit"}, "quitter"), _json({"echo": 1})]
    )
    assert [r.status for r in outcome.responses] == [500, 200]
    assert body_json(outcome.responses[0])["type"] == "SystemExit"


def test_prediction_exception_on_a_batch_is_bisected_and_scrubbed(poison_dir: Path) -> None:
    service = load_service(poison_dir)
    bad = {"raise": "prediction", "code": 409, "message": "busy\nTraceback (most recent"}
    weird = {"raise": "prediction", "code": 99999, "message": "at /opt/x/y.py"}
    outcome = service.predict(
        [_json({"echo": "a"}), _json(bad), _json(weird), _json({"echo": "b"}, "b")]
    )
    assert [r.status for r in outcome.responses] == [200, 409, 500, 200]
    assert body_json(outcome.responses[1])["message"] == "busy"
    assert body_json(outcome.responses[2])["message"] == "at <path>"
    assert body_json(outcome.responses[3])["echo"] == "b"


# -- status classes of the tensor handler ------------------------------------------------------


def test_tensor_model_failures_are_422_and_isolated(torchscript_dir, tiny_model) -> None:
    service = load_service(torchscript_dir(), batch_size=8)
    good = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X}]}
    wrong_shape = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": X[:3]}]}
    wrong_dtype = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT64", "data": [1] * 4}]}
    bytes_in = {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}
    bodies = [good, wrong_shape, good, wrong_shape, wrong_dtype, good, bytes_in, good]
    outcome = service.predict([req(json.dumps(b), protocol="v2") for b in bodies])
    assert [r.status for r in outcome.responses] == [200, 422, 200, 422, 422, 200, 422, 200]
    with torch.no_grad():
        want = tiny_model(torch.tensor([X])).tolist()[0]
    for i in (0, 2, 5, 7):
        assert body_json(outcome.responses[i])["outputs"][0]["data"] == pytest.approx(want)
    for response in outcome.responses:
        _assert_clean(response.body)
    assert body_json(outcome.responses[1])["type"] == "UnprocessableInput"


def test_builtin_handlers_answer_an_undecodable_json_body_400(torchscript_dir) -> None:
    """A body labelled JSON that is not JSON reaches the handler raw (as on TorchServe); the
    tensor handler must not read its 16 bytes as four float32s (a 200 with a made-up input)."""
    service = load_service(torchscript_dir(), batch_size=4)
    bad = b'[1.0, 2.0, 3.0,"'
    assert len(bad) == 16
    outcome = service.predict([req(bad, "application/json"), _json([X], "good")])
    assert [r.status for r in outcome.responses] == [400, 200]
    assert body_json(outcome.responses[0])["message"].startswith("body is not valid JSON")


def test_manifest_shape_mismatch_is_400_before_inference(torchscript_dir) -> None:
    # the manifest's input_shape is the model's signature (input0, FP32 [-1, 4]): checked by name
    service = load_service(torchscript_dir(torchbay={"input_shape": [4]}))
    wrong = {"inputs": [{"name": "input0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    outcome = service.predict([req(json.dumps(wrong), protocol="v2")])
    assert outcome.responses[0].status == 400
    assert "the model expects [-1, 4]" in body_json(outcome.responses[0])["message"]


# -- handler-set statuses and headers ----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"status": 99999},
        {"status": 99},
        {"status": True},
        {"header": ["x-bad", "a\r\nb"]},
        {"header": ["x-bad", "a\nb"]},
        {"header": ["x-bad", "nul\x00"]},
        {"header": ["x bad", "ok"]},
        {"header": ["x-bad:", "ok"]},
        {"header": ["x-snow", "\u2603"]},
        {"header": ["content-type", "text/plain\r\nx-injected: 1"]},
    ],
)
def test_invalid_status_or_header_is_a_500_for_that_request(
    poison_dir: Path, body: dict[str, Any]
) -> None:
    outcome = load_service(poison_dir).predict([_json(body, "bad"), _json({"echo": 2}, "ok")])
    assert [r.status for r in outcome.responses] == [500, 200]
    error = body_json(outcome.responses[0])
    assert error["type"] == "InvalidResponse" and "request id bad" in error["message"]
    assert outcome.responses[0].headers == {}


def test_valid_headers_pass_and_framing_headers_are_dropped(poison_dir: Path) -> None:
    service = load_service(poison_dir)
    outcome = service.predict(
        [
            _json({"header": ["X-Extra", "caf\u00e9"], "status": 201}),
            _json({"header": ["Content-Length", "1"]}),
        ]
    )
    assert [r.status for r in outcome.responses] == [201, 200]
    assert outcome.responses[0].headers == {"x-extra": "caf\u00e9"}
    assert outcome.responses[1].headers == {}


# -- NaN / Infinity ----------------------------------------------------------------------------


def test_nan_and_infinity_are_written_as_null(poison_dir: Path, torchscript_dir) -> None:
    nan_in = {"name": "x", "shape": [1], "datatype": "BYTES", "data": ['{"nan": true}']}
    v2_nan = {"inputs": [nan_in], "parameters": {}}
    service = load_service(poison_dir)
    outcome = service.predict([_json({"nan": True}), req(json.dumps(v2_nan), protocol="v2")])
    assert outcome.responses[0].body == b'{"values":[null,null,null,1.5]}'
    # a v2 request to a handler that does not speak v2: its result is one BYTES tensor of JSON
    [out] = body_json(outcome.responses[1])["outputs"]
    assert out["datatype"] == "BYTES" and out["data"] == ['{"values":[null,null,null,1.5]}']
    service = load_service(torchscript_dir())
    nan_in = req(b"[NaN, 1, 2, 3]", "application/json")
    v2 = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1e39, 1, 2, 3]}]}
    outcome = service.predict([nan_in, req(json.dumps(v2), protocol="v2")])
    assert [r.status for r in outcome.responses] == [200, 200]
    assert body_json(outcome.responses[0])["output"] == [None, None, None]
    data = body_json(outcome.responses[1])["outputs"][0]["data"]
    assert all(v is None or math.isfinite(v) for v in data) and None in data
    for response in outcome.responses:
        json.loads(response.body, parse_constant=lambda c: pytest.fail(f"bare {c}"))


# -- the worker's last-resort guard ------------------------------------------------------------


def test_worker_answers_every_request_when_predict_itself_raises(poison_dir: Path) -> None:
    service = load_service(poison_dir)

    def broken(requests: Any) -> Any:  # a bug of ours inside predict, which must not end the loop
        raise RecursionError("deep in /work/torchbay/handlers/service.py")

    service.predict = broken  # type: ignore[method-assign]
    infer = p.Infer(
        batch_id=9,
        requests=[p.WireRequest("a", b"{}"), p.WireRequest("b", b"{}", protocol="v2")],
    )
    result = _predict(service, infer)
    assert result.batch_id == 9 and [r.status for r in result.responses] == [500, 500]
    assert body_json(result.responses[1])["error"].endswith("request id b")
    for response in result.responses:
        _assert_clean(response.body)


def test_image_the_model_cannot_take_is_422_and_its_mates_answered(tmp_path: Path) -> None:
    from .test_classifiers import TinyCNN, png

    torch.manual_seed(0)
    torch.jit.script(TinyCNN().eval()).save(str(tmp_path / "cnn.pt"))
    write_manifest(tmp_path, serialized="cnn.pt", handler="image_classifier")
    service = load_service(tmp_path, batch_size=4)
    five_channels = [[[0.5] * 8 for _ in range(8)] for _ in range(5)]  # the CNN wants 3
    outcome = service.predict(
        [
            req(png(), "image/png", "a"),
            _json({"data": five_channels}, "five"),
            req(png(), "image/png", "c"),
        ]
    )
    assert [r.status for r in outcome.responses] == [200, 422, 200]
    assert body_json(outcome.responses[0]) == body_json(outcome.responses[2])
    error = body_json(outcome.responses[1])
    assert error["type"] == "UnprocessableInput" and error["message"].endswith("request id five")
    _assert_clean(outcome.responses[1].body)


def test_worker_answers_every_request_when_a_result_cannot_be_framed() -> None:
    import socket

    from torchbay.server.worker.main import _frame

    infer = p.Infer(batch_id=4, requests=[p.WireRequest("a", b""), p.WireRequest("b", b"")])
    ok = p.WireResponse(200, b"{}")
    unframable = p.Result(4, [ok, ok], {}, [{"value": {1, 2}}])  # a set is not JSON
    left, right = socket.socketpair()
    with left, right:
        left.sendall(_frame(unframable, infer))
        result = transport.recv_message(right)
    assert isinstance(result, p.Result) and result.batch_id == 4
    assert [r.status for r in result.responses] == [500, 500]
    assert body_json(result.responses[0])["message"].endswith("request id a")


def test_npy_header_claiming_a_huge_array_is_400_without_allocating(torchscript_dir) -> None:
    import io

    import numpy as np

    def npy(shape: tuple[int, ...], payload: bytes, descr: str = "<f4") -> bytes:
        out = io.BytesIO()
        header = {"descr": descr, "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(out, header)
        return out.getvalue() + payload

    good = io.BytesIO()
    np.save(good, np.array(X, dtype=np.float32))
    service = load_service(torchscript_dir())
    octet = "application/octet-stream"
    outcome = service.predict(
        [
            req(npy((10**12,), b"\0" * 16), octet, "huge"),
            req(npy((10**6, 10**6, 10**6), b"\0" * 16), octet, "overflow"),
            req(npy((2,), b"\0" * 16, "|O"), octet, "pickled"),
            req(good.getvalue(), octet, "good"),
        ]
    )
    assert [r.status for r in outcome.responses] == [400, 400, 400, 200]
    assert "does not hold" in body_json(outcome.responses[0])["message"]
