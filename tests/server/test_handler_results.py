"""How a handler's results are answered, kind by kind, as TorchServe 0.12 answers them
(tests/data/torchserve/result_types: answers.json, made by record.py there, which also holds the
handler, results_handler.py, and the kinds, cases.py): status, content type, the handler's
response header and the body.

Where torchbay differs on purpose (README's differences table), ``_torchbays`` says how.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import handler_ports, recorded

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "result_types"
CASES, RECORD = recorded(DATA, "cases.py")


def _torchbays(answer: dict[str, Any]) -> dict[str, Any]:
    """TorchServe's answer as torchbay gives it: a content type where the handler set none
    (a str as UTF-8 text, bytes and a tensor as octet-stream, anything else as JSON, written
    compact), no reason phrase of the handler's (ASGI sends the status's own), and a handler's
    error status with no result answered with the error JSON, its phrase the message."""
    expected = copy.deepcopy(answer)
    kind = answer["id"]
    del expected["reason"]
    if expected["content_type"] is None:
        if kind in ("str", "json_str", "header", "created"):
            expected["content_type"] = "text/plain; charset=utf-8"
        elif kind in ("bytes", "tensor"):
            expected["content_type"] = "application/octet-stream"
        else:
            expected["content_type"] = "application/json"
            compact = json.dumps(json.loads(expected["body"]), separators=(",", ":"))
            expected["body"] = compact
    if kind == "teapot_none":
        message = {"code": 418, "type": "PredictionException", "message": "Short and stout"}
        expected["body"] = json.dumps(message, separators=(",", ":"))
    return expected


def test_the_record_is_torchserve_0_12() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert "result_types/record.py" in RECORD["command"]
    assert [a["id"] for a in RECORD["answers"]] == CASES.KINDS


@pytest.mark.timeout(300)
def test_a_handlers_results_are_answered_as_torchserve_answers_them(tmp_path: Path) -> None:
    """A tensor result was answered as JSON (its values as a list); TorchServe 0.12 answers
    it as ``torch.save`` writes it (a client reads it with ``torch.load``). And on OIP infer
    a tensor result was a 500 ("cannot reshape array of size 2 into shape ()"): TorchServe's
    kservev2 envelope answers it as one output tensor."""
    with handler_ports(tmp_path, "results", DATA / "results_handler.py") as ports:
        port = ports.inference
        for answer in RECORD["answers"]:
            got = CASES.ask(port, answer["id"])
            del got["reason"]
            assert {"id": answer["id"], **got} == _torchbays(answer)
        # KServe v1 answers one JSON body: a tensor is its values there, as it always was
        url = f"http://127.0.0.1:{port}/v1/models/results:predict"
        v1 = httpx.post(url, json={"instances": ["tensor", "dict"]}, timeout=60)
        assert v1.status_code == 200, v1.text
        assert v1.json() == {"predictions": [[1.0, 2.0], {"a": [1, 2.5]}]}
        # OIP: a tensor is one output tensor, as TorchServe's kservev2 envelope makes it
        url = f"http://127.0.0.1:{port}/v2/models/results/infer"
        tensor = {"name": "kind", "shape": [1], "datatype": "BYTES", "data": ["tensor"]}
        v2 = httpx.post(url, json={"inputs": [tensor]}, timeout=60)
        assert v2.status_code == 200, v2.text
        output = {"name": "output0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
        assert v2.json()["outputs"] == [output]
        # the generate extension answers JSON too: a tensor is its values' text
        url = f"http://127.0.0.1:{port}/v2/models/results/generate"
        generated = httpx.post(url, json={"text_input": "tensor"}, timeout=60)
        assert generated.status_code == 200, generated.text
        assert generated.json()["text_output"] == "[1.0, 2.0]"
