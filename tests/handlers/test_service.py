from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchbay.handlers.errors import HandlerLoadError
from torchbay.handlers.runtime.service import load_service
from torchbay.handlers.testing import run_handler

from .conftest import body_json, req, write_manifest

ECHO_HANDLERS = '''
import json


class Echo:
    """Not a BaseHandler: any class with handle() is a handler."""

    def initialize(self, context):
        self.name = context.model_name
        self.config = context.model_yaml_config

    def handle(self, data, context):
        out = []
        for i, row in enumerate(data):
            if row.get("status"):
                context.set_response_status(int(row["status"]), "asked for it", i)
            if row.get("kind") == "bytes":
                context.set_response_content_type(i, "image/x-test")
                out.append(b"\\x00raw")
            elif row.get("kind") == "text":
                context.set_response_header(i, "x-echo", context.get_request_header(i, "x-in"))
                out.append("hello")
            elif row.get("kind") == "short":
                return []
            elif row.get("kind") == "crash":
                raise RuntimeError("boom")
            else:
                raw = (bytes, bytearray)
                out.append({k: (v.decode() if isinstance(v, raw) else v) for k, v in row.items()})
        context.metrics.add_counter("EchoCount", len(data), dimensions={"Kind": "echo"})
        context.metrics.add_metric_to_cache("EchoSize", "B", ["Part"]).add_or_update(7, ["x"])
        return out


def fn_handle(data, context):
    if data is None:  # TorchServe calls function handlers once with None to initialize
        return None
    return [{"fn": True, "rid": context.get_request_id(i)} for i in range(len(data))]
'''


@pytest.fixture
def echo_dir(tmp_path: Path) -> Path:
    (tmp_path / "echo.py").write_text(ECHO_HANDLERS)
    (tmp_path / "model-config.yaml").write_text("minWorkers: 1\nhandler:\n  greeting: hi\n")
    write_manifest(tmp_path, serialized=None, handler="echo.py", config_file="model-config.yaml")
    return tmp_path


def test_rows_multipart_query_and_encodings(echo_dir: Path) -> None:
    service = load_service(echo_dir, model_name="renamed", model_version="3")
    assert service.model_name == "renamed" and service.model_version == "3"
    assert service.handler.config == {"minWorkers": 1, "handler": {"greeting": "hi"}}
    boundary = "XyZ"
    multipart = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="field"\r\n\r\nvalue\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="data"; filename="a.bin"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n\x01\r\n\x02\r\n--{boundary}--\r\n"
    ).encode("latin-1")
    outcome = service.predict(
        [
            req(multipart, f"multipart/form-data; boundary={boundary}", "m", query="q=1&kind=x"),
            req(b"a=1&b=two", "application/x-www-form-urlencoded", "f"),
            req(b"", "", "b", query="kind=bytes"),
            req("plain", "text/plain", "t", query="kind=text", headers={"x-in": "yes"}),
            req('{"k": [1, 2]}', "application/json", "j", query="status=418"),
        ]
    )
    multi, form, raw, text, teapot = outcome.responses
    assert body_json(multi) == {"field": "value", "data": "\x01\r\n\x02", "q": "1", "kind": "x"}
    assert body_json(form) == {"a": "1", "b": "two"}
    assert (raw.status, raw.body, raw.content_type) == (200, b"\x00raw", "image/x-test")
    assert (text.body, text.content_type, text.headers) == (
        b"hello",
        "text/plain; charset=utf-8",
        {"x-echo": "yes"},
    )
    assert teapot.status == 418 and body_json(teapot) == {"body": {"k": [1, 2]}, "status": "418"}
    names = {m["name"]: m for m in outcome.metrics}
    assert names["EchoCount"] == {
        "name": "EchoCount",
        "type": "counter",
        "unit": "count",
        "value": 5.0,
        "dimensions": {"ModelName": "renamed", "Level": "Model", "Kind": "echo"},
    }
    assert names["EchoSize"]["dimensions"]["Part"] == "x" and names["EchoSize"]["unit"] == "B"
    assert service.predict([req(b"{}", "application/json")]).metrics[0]["value"] == 1.0


def test_statuses_reset_between_batches(echo_dir: Path) -> None:
    service = load_service(echo_dir)
    assert service.predict([req(b"", query="status=503")]).responses[0].status == 503
    assert service.predict([req(b"", query="kind=x")]).responses[0].status == 200


def test_count_mismatch_fails_only_the_request_that_causes_it(echo_dir: Path) -> None:
    outcome = load_service(echo_dir).predict([req(b"", query="kind=short"), req(b"x")])
    assert [r.status for r in outcome.responses] == [500, 200]  # bisected
    assert body_json(outcome.responses[0])["message"] == "number of batch response mismatched"
    assert body_json(outcome.responses[1])["body"] == "x"


def test_uncaught_exception_fails_only_its_request_without_traceback(echo_dir: Path) -> None:
    outcome = load_service(echo_dir).predict(
        [req(b"x", rid="ok"), req(b"", rid="bad-1", query="kind=crash")]
    )
    assert [r.status for r in outcome.responses] == [200, 500]  # bisected: the mate is answered
    assert body_json(outcome.responses[0])["body"] == "x"
    body = body_json(outcome.responses[1])
    assert body == {
        "code": 500,
        "type": "RuntimeError",
        "message": "The handler failed on this request (RuntimeError); request id bad-1",
    }
    assert "handler" in outcome.timings


def test_bad_json_reaches_the_handler_raw_as_on_torchserve(echo_dir: Path) -> None:
    """TorchServe 0.12 hands a body labelled JSON that is not JSON to the handler as its bytes
    (tests/data/torchserve/handler_inputs); torchbay's own handlers answer it 400 (map_items)."""
    outcome = load_service(echo_dir).predict([req(b"{", "application/json"), req(b"ok")])
    assert [r.status for r in outcome.responses] == [200, 200]
    assert body_json(outcome.responses[0]) == {"body": "{"}


def test_function_handler(echo_dir: Path) -> None:
    service = load_service(echo_dir, handler="echo.py:fn_handle")
    outcome = service.predict([req(b"a", rid="id-1"), req(b"b", rid="id-2")])
    assert [body_json(r) for r in outcome.responses] == [
        {"fn": True, "rid": "id-1"},
        {"fn": True, "rid": "id-2"},
    ]


def test_v2_envelope_for_non_native_handler(echo_dir: Path) -> None:
    request = {
        "id": "7",
        "inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x"]}],
    }
    outcome = load_service(echo_dir).predict([req(json.dumps(request), protocol="v2")])
    body = body_json(outcome.responses[0])
    assert body["id"] == "7" and body["model_name"] == "tiny"
    [out] = body["outputs"]
    assert out["datatype"] == "BYTES" and json.loads(out["data"][0])["body"] == "x"


def _raw_reply(data, context):
    if data is None:
        return None
    return [bytearray(b"hello"), memoryview(b"world"), b"!"][: len(data)]


def test_a_v2_request_takes_a_bytearray_result_as_predictions_does() -> None:
    """A handler answering a bytearray (as TorchServe's handlers often do) or a memoryview was
    a 500 on the v2 routes ("the handler's result cannot be encoded"): only bytes were text."""
    request = {"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
    replies = run_handler(_raw_reply, [request] * 3, protocol="v2")
    assert [r.status for r in replies] == [200, 200, 200]
    outputs = [r.json()["outputs"] for r in replies]
    assert [o[0]["data"] for o in outputs] == [["hello"], ["world"], ["!"]]
    assert {o[0]["datatype"] for o in outputs} == {"BYTES"}


TS_HANDLER = """
import torch
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException, map_class_to_label
from ts.context import Context


class Doubler(BaseHandler):
    def preprocess(self, data):
        values = [row.get("data") or row.get("body") for row in data]
        if any(v == "teapot" for v in values):
            raise PredictionException("I am a teapot", 418)
        return torch.tensor(values, dtype=torch.float32)

    def postprocess(self, data):
        assert isinstance(self.context, Context)
        return map_class_to_label(data.tolist())
"""


def test_torchserve_style_handler(torchscript_dir) -> None:
    model_dir = torchscript_dir(handler="doubler.py")
    (model_dir / "doubler.py").write_text(TS_HANDLER)
    service = load_service(model_dir)
    ok = service.predict([req("[1, 2, 3, 4]", "application/json")])
    assert ok.responses[0].status == 200
    assert set(body_json(ok.responses[0])) == {"0", "1", "2"}
    teapot = service.predict([req("teapot", "text/plain"), req("[1,2,3,4]", "application/json")])
    # The batch-wide PredictionException is bisected down to the request that raised it.
    assert [r.status for r in teapot.responses] == [418, 200]
    assert body_json(teapot.responses[0]) == {
        "code": 418,
        "type": "PredictionException",
        "message": "I am a teapot",
    }
    assert set(body_json(teapot.responses[1])) == {"0", "1", "2"}


@pytest.mark.parametrize(
    ("spec", "source", "expected"),
    [
        ("tensor", None, "TensorHandler"),
        ("base", None, "TensorHandler"),
        ("image_classifier", None, "ImageClassifier"),
        ("h.py", "from torchbay.handlers.tensor import TensorHandler\n\n"
         "class Mine(TensorHandler):\n    pass\n\n\nclass Helper:\n    pass\n", "Mine"),
        ("h", "from ts.torch_handler.base_handler import BaseHandler\n\n"
         "class A(BaseHandler):\n    pass\n\n\nclass B(A):\n    pass\n", "B"),
        ("h:run", "def run(data, context):\n    return data\n", None),
        ("h.py", "def handle(data, context):\n    return data\n", None),
    ],
)  # fmt: skip
def test_resolution_forms(
    tmp_path: Path, spec: str, source: str | None, expected: str | None
) -> None:
    from torchbay.handlers.runtime.resolve import install_ts_alias, resolve_handler

    install_ts_alias()
    if source is not None:
        (tmp_path / "h.py").write_text(source)
    resolved = resolve_handler(spec, tmp_path)
    if expected is None:
        assert resolved.is_function and resolved.entry([1], None) == [1]
    else:
        assert type(resolved.instance).__name__ == expected


@pytest.mark.parametrize(
    ("spec", "source", "match"),
    [
        ("no_such_handler", None, "unknown handler"),
        ("missing.py", None, "not found"),
        ("h.py:nope", "def run(d, c):\n    return d\n", "no function"),
        ("h.py", "class A:\n    def handle(self, d, c): ...\n"
                 "class B:\n    def handle(self, d, c): ...\n", "several handler classes"),
        ("h.py", "raise ImportError('needs a package')\n", "importing"),
        ("h.py", "X = 1\n", "no handler class"),
    ],
)  # fmt: skip
def test_resolution_errors(tmp_path: Path, spec: str, source: str | None, match: str) -> None:
    if source is not None:
        (tmp_path / "h.py").write_text(source)
    write_manifest(tmp_path, serialized=None, handler=spec)
    with pytest.raises(HandlerLoadError, match=match):
        load_service(tmp_path)


def test_lightweight_modules_do_not_import_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        import torchbay.handlers
        import torchbay.handlers.errors, torchbay.handlers.context, torchbay.handlers.metrics
        import torchbay.handlers.utils, torchbay.handlers.runtime.envelopes
        import torchbay.handlers.runtime.service
        from torchbay.handlers import load_service, Request, HandlerLoadError
        assert "torch" not in sys.modules, "torch was imported"
        assert "ts" not in sys.modules, "the ts alias was installed at import"
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_form_field_named_as_a_control_header_is_an_input_not_the_header(
    torchscript_dir,
) -> None:
    """The context lists each input parameter among a request's headers (``{"content-type":
    ...}`` under its name, as TorchServe 0.12 does): a form field named ``describe``,
    ``explain``, ``x-input-dtype`` or ``ts_request_sequence_id`` must not read as that header
    (a describe answer, an explanation, a 500 on ``.strip()`` or on a dict response header)."""
    service = load_service(torchscript_dir())
    boundary = "XyZ"
    parts = [("data", '"a.json"', "application/json", "[1, 2, 3, 4]")]
    names = ("describe", "explain", "x-input-dtype", "ts_request_sequence_id")
    parts += [(name, None, None, "True") for name in names]
    body = "".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"'
        + (f"; filename={filename}\r\nContent-Type: {ctype}" if filename else "")
        + f"\r\n\r\n{value}\r\n"
        for name, filename, ctype, value in parts
    )
    form = req(f"{body}--{boundary}--\r\n", f"multipart/form-data; boundary={boundary}")
    plain = service.predict([req("[1, 2, 3, 4]", "application/json")]).responses[0]
    got = service.predict([form]).responses[0]
    assert (got.status, got.headers, body_json(got)) == (200, {}, body_json(plain))
