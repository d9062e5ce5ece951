"""A handler written for TorchServe reads SageMaker's request headers (X-Amzn-SageMaker-Custom-
Attributes, -Target-Model, Content-Type, Accept) from its request's properties by the names
SageMaker spells, as on TorchServe 0.12 (tests/data/torchserve/sagemaker_headers: answers.json,
made by record.py there, with the handler beside it).

TorchServe keeps the client's spelling and looks names up as spelled; torchbay's headers arrive
in lower case (ASGI), so its properties are looked up in any case: every name TorchServe finds is
found, and the lower-case request TorchServe cannot read (``lower_case``) is read too.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest

from tests.server.conftest import handler_ports

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "sagemaker_headers"
RECORD = json.loads((DATA / "answers.json").read_text())


def test_the_record_is_torchserve_0_12() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert "sagemaker_headers/record.py" in RECORD["command"]


def _ask(port: int, headers: dict[str, str]) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", "/invocations", body=b'{"x": 1}', headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _read_in_any_case(answer: dict) -> dict:
    """What torchbay answers where TorchServe looked a name up as spelled: the value sent."""
    sent = {name.lower(): value for name, value in answer["headers"].items()}
    names = answer["body"]["get"]
    found = {name: sent.get(name.lower()) for name in names}
    return {
        "get": found,
        "item": {name: value for name, value in found.items() if value is not None},
        "header": found,
    }


@pytest.mark.timeout(300)
def test_a_handler_reads_sagemakers_headers_by_sagemakers_names(tmp_path: Path) -> None:
    """``props.get("X-Amzn-SageMaker-Custom-Attributes")`` was None on torchbay (its names were
    lower case only) where TorchServe answers the attributes: only ``get_request_header``
    found them."""
    with handler_ports(tmp_path, "headers", DATA / "headers_handler.py") as ports:
        port = ports.inference
        for answer in RECORD["answers"]:
            status, body = _ask(port, answer["headers"])
            assert status == answer["status"], body
            expected = answer["body"] if answer["id"] != "lower_case" else _read_in_any_case(answer)
            assert body == expected, answer["id"]
