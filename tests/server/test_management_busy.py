"""Management calls that meet a version while it is being unregistered (its worker busy, the
unregister draining it), against what TorchServe 0.12 answered (tests/data/torchserve_0.12/busy:
busy.py's scenario, record.py's answers). TorchServe takes the version out of its map before it
drains it: a set-default, scale, describe or second unregister meanwhile is a 404 at once.

Compared: every status, an error's code and message, a status message whole, describe's
versions. What torchbay does differently on purpose is in DIFFERENCES, each a row of the
README's "Differences from TorchServe".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import recorded, recorded_store, running

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve_0.12" / "busy"
busy, RECORD = recorded(DATA, "busy.py")

# step id -> (torchbay's answer, why)
DIFFERENCES: dict[str, tuple[Any, str]] = {
    "held_request": (
        [200, {"ok": True}],
        "an unregister drains its version: the request it runs is answered (TorchServe kills "
        "the worker: 500 'Worker died.')",
    ),
}


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    store = recorded_store(tmp_path_factory, "busy-store", busy.ARCHIVES, DATA)
    with running(store, enable_model_api=True) as live, httpx.Client(timeout=120) as client:

        def call(method: str, url: str, body: bytes | None) -> tuple[int, Any]:
            headers = {"content-type": "application/json"} if body is not None else {}
            r = client.request(method, url, content=body, headers=headers)
            try:
                return r.status_code, r.json()
            except ValueError:
                return r.status_code, r.text

        gates = tmp_path_factory.mktemp("busy-gates")
        yield busy.run(call, live.url, live.management_url, gates)


def _comparable(answer: Any) -> Any:
    """An error body by its code and message (the type is Java's class name there)."""
    if isinstance(answer, list) and len(answer) == 2 and isinstance(answer[1], dict):
        status, body = answer
        if "code" in body:
            return [status, {"code": body["code"], "message": body["message"]}]
    return answer


def test_record_is_torchserve_0_12() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert RECORD["command"].endswith("tests/data/torchserve_0.12/busy/record.py")


@pytest.mark.parametrize("step", list(RECORD["answers"]))
def test_same_answers(answers: dict[str, Any], step: str) -> None:
    expected = RECORD["answers"][step]
    if step in DIFFERENCES:
        expected = DIFFERENCES[step][0]
    assert _comparable(answers[step]) == _comparable(expected), json.dumps(answers[step])
