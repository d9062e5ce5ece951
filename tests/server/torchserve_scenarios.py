"""What the tests that run a TorchServe 0.12 recorder's scenario against torchbay share
(test_management_answers.py: tests/data/torchserve_0.12/answers, test_management_busy.py: its
busy/): the scenario's ``call`` over an httpx client, an answer as compared with the record's,
and the check that the record is TorchServe 0.12's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

Call = Callable[[str, str, "bytes | None"], tuple[int, Any]]


def json_call(client: httpx.Client) -> Call:
    """The scenario's ``call(method, url, body)`` over ``client``: a body sent as JSON, the
    answer (status, its JSON, or its text when it is not JSON)."""

    def call(method: str, url: str, body: bytes | None) -> tuple[int, Any]:
        headers = {"content-type": "application/json"} if body is not None else {}
        r = client.request(method, url, content=body, headers=headers)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    return call


def comparable(answer: Any) -> Any:
    """An error body by its code and message (its type is Java's class name there)."""
    if isinstance(answer, list) and len(answer) == 2 and isinstance(answer[1], dict):
        status, body = answer
        if "code" in body:
            return [status, {"code": body["code"], "message": body["message"]}]
    return answer


def assert_torchserve_0_12(record: dict[str, Any], recorder: str) -> None:
    """``record`` was made by TorchServe 0.12.0, with tests/data/torchserve_0.12/``recorder``."""
    assert record["torchserve"] == "0.12.0"
    assert record["command"].endswith(f"tests/data/torchserve_0.12/{recorder}")
