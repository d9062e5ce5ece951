"""What a handler written for TorchServe receives, case by case as TorchServe 0.12 hands it
(tests/data/torchserve/handler_inputs: answers.json, made by record.py there, which also holds
the handler and the requests, cases.py): each row key's type and value, and what
``context.get_request_header`` gives.

torchbay hands the same types: a raw body, a form field, a urlencoded field or a file part of no
text or JSON type as a bytearray (an unchanged TorchServe handler calls ``.decode()`` on it), a
text file part as str, a JSON file part parsed, and a body labelled JSON that is not JSON as its
raw bytes. Where torchbay differs on purpose (docs/handlers.md), ``_torchbays`` says how.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from tests.server.conftest import handler_ports, recorded

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "handler_inputs"
CASES, RECORD = recorded(DATA, "cases.py")
# The requests whose query string TorchServe 0.12 does not hand over on /predictions; torchbay
# adds its parameters (as str; the last of a repeated one, as on /invocations) for the keys
# the body did not set.
QUERY_ADDED = {"query": {"q": "2", "r": "\u00e9", "blank": ""}, "query_no_body": {"q": "1"}}


def _row(answer: dict[str, Any]) -> dict[str, list[Any]]:
    return {key: [kind, value] for key, kind, value in answer["body"]["row"]}


def _torchbays(answer: dict[str, Any], sent: dict[str, str]) -> dict[str, Any]:
    """TorchServe's answer as torchbay gives it: a text body in its declared charset (TorchServe
    decodes UTF-8 whatever the charset, and hands what fails raw), ``+json`` parsed, query
    parameters as str (also on /predictions) and request headers found in any case."""
    expected = copy.deepcopy(answer["body"])
    row = _row(answer)
    if answer["id"] == "text_latin1":
        row["body"] = ["str", "h\u00e9llo"]
    if answer["id"] == "ld_json":
        row["body"] = ["dict", {"x": 1}]
    for key, value in QUERY_ADDED.get(answer["id"], {}).items():
        row[key] = ["str", value]
    if answer["id"].startswith("inv_query"):
        row["q"] = ["str", row["q"][1]]
    lower = {name.lower(): value for name, value in sent.items()}
    for name, got in expected["headers"].items():
        if got[1] is None and name.lower() in lower:
            expected["headers"][name] = ["str", lower[name.lower()]]
    expected["row"] = row
    return expected


def _kind(name: str) -> str:
    """A value's type name, torchbay's bytearray subclass for a body that did not decode
    (envelopes.Undecoded: it carries the reason torchbay's own handlers answer 400 with) as the
    bytearray it is."""
    return "bytearray" if name == "Undecoded" else name


def test_the_record_is_torchserve_0_12() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert "handler_inputs/record.py" in RECORD["command"]
    assert [a["id"] for a in RECORD["answers"]] == [c[0] for c in CASES.CASES]


@pytest.mark.timeout(300)
def test_a_torchserve_handler_gets_torchserves_input_types(tmp_path: Path) -> None:
    """Form fields and urlencoded fields were str on torchbay (``field.decode()``, as a
    TorchServe handler does, failed: 500), file parts bytes whatever their type, a body
    labelled JSON that is not JSON a 400 before the handler ran; TorchServe hands bytearrays,
    decodes a text or JSON file part, and hands the undecodable body raw. And each input
    parameter's content type was missing from the request's headers, where TorchServe files it
    under the parameter's name (``get_request_header(idx, "data")["content-type"]``)."""
    by_id = {case[0]: case for case in CASES.CASES}
    with handler_ports(tmp_path, "inputs", DATA / "inputs_handler.py") as ports:
        port = ports.inference
        for answer in RECORD["answers"]:
            _, path, query, headers, body = by_id[answer["id"]]
            asked = CASES.ask(port, path, query, headers, body)
            status, got = asked["status"], asked["body"]
            assert status == answer["status"] == 200, (answer["id"], got)
            got["row"] = {key: [_kind(kind), value] for key, kind, value in got["row"]}
            assert got == _torchbays(answer, headers), answer["id"]


@pytest.mark.timeout(300)
def test_a_grpc_input_is_a_parameter_without_a_content_type(
    tmp_path: Path, ts_stubs: SimpleNamespace
) -> None:
    """TorchServe's gRPC Predictions makes each entry of the input map a parameter with no
    content type (InferenceImpl: ``InputParameter(name, bytes)``): the handler gets it as a
    bytearray and ``get_request_header(idx, name)`` as ``{"content-type": ""}``; torchbay's
    said application/octet-stream, the type of the file parts that carried the entries."""
    inputs = {"body": b"\x00raw", "field": b"text"}
    request = ts_stubs.inference_pb2.PredictionsRequest(model_name="inputs", input=inputs)
    with (
        handler_ports(tmp_path, "inputs", DATA / "inputs_handler.py") as ports,
        grpc.insecure_channel(f"127.0.0.1:{ports.grpc_inference}") as channel,
    ):
        stub = ts_stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        got = json.loads(stub.Predictions(request, timeout=120).prediction)
    assert got["row"] == [["body", "bytearray", "\x00raw"], ["field", "bytearray", "text"]]
    assert got["headers"]["body"] == got["headers"]["field"] == ["dict", {"content-type": ""}]
