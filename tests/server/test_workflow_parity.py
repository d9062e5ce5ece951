"""TorchServe 0.12 workflow parity: the recorded workflow steps (tests/data/torchserve/workflows:
register, list, describe, predict with fan-out and fan-in, failing nodes, unregister, bad
requests) replayed against a live torchbay serving the same ``.war`` and ``.mar`` archives, built
by TorchServe's own archivers, and compared with what TorchServe 0.12 answered.

Compared: every status; error bodies' code, type and message; status messages; list and
describe bodies; the prediction bodies (the DAG's answer). Where torchbay answers otherwise on
purpose, DIFFERENCES says so and why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import running
from tests.server.workflow_store import (
    ANSWERS,
    LIVE_MARKS,
    RECORD,
    build_model_store,
    build_workflow_store,
    steps,
)

pytestmark = LIVE_MARKS

# step id -> the error type torchbay answers instead of TorchServe's, and why.
DIFFERENCES = {
    # torchbay's management app names its 405 as every other 405 of the API.
    "scale_workflow": "MethodNotAllowed",
}
# describe keys of a node model compared as recorded (the rest are torchbay's or live values).
NODE_KEYS = ("modelName", "modelVersion", "modelUrl", "minWorkers", "maxWorkers", "batchSize",
             "maxBatchDelay", "loadedAtStartup")  # fmt: skip


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """torchbay's answer to every step, in order, from one live server."""
    models = build_model_store(tmp_path_factory.mktemp("wf-models"))
    workflows = build_workflow_store(tmp_path_factory.mktemp("wf-wars"))
    out: dict[str, dict[str, Any]] = {}
    with running(models, workflow_store=workflows, enable_model_api=True) as live:
        bases = {"inference": live.url, "management": live.management_url}
        with httpx.Client(timeout=300) as client:
            for step in steps.STEPS:
                response = client.request(
                    step["method"], bases[step["listener"]] + step["path"], json=step.get("json")
                )
                try:
                    body = response.json()
                except ValueError:
                    body = response.text
                out[step["id"]] = {"status": response.status_code, "body": body}
    return out


def test_the_record_is_torchserve_0_12() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert RECORD["workflow_archiver"] == "0.2.15"
    assert RECORD["command"].endswith("tests/data/torchserve/workflows/record.py")
    assert [a["id"] for a in RECORD["answers"]] == [s["id"] for s in steps.STEPS]


@pytest.mark.parametrize("step", [s["id"] for s in steps.STEPS])
def test_torchbay_answers_as_torchserve(answers: dict[str, dict[str, Any]], step: str) -> None:
    ours, theirs = answers[step], ANSWERS[step]
    assert ours["status"] == theirs["status"], (step, ours["body"])
    body, recorded = ours["body"], theirs["body"]
    if step == "describe_node":
        assert [{k: e[k] for k in NODE_KEYS} for e in body] == [
            {k: e[k] for k in NODE_KEYS} for e in recorded
        ]
        return
    if isinstance(recorded, dict) and "code" in recorded:
        expected = {**recorded, "type": DIFFERENCES.get(step, recorded["type"])}
        assert body == expected
        return
    assert body == recorded


def test_fan_in_gets_each_parent_by_name(answers: dict[str, dict[str, Any]]) -> None:
    """The aggregate node saw one input per parent, named by the parent node."""
    assert answers["predict"]["body"] == {"sum": [3.0, 8.0, 15.0], "inputs": ["double", "square"]}
    split = answers["predict_split"]["body"]
    assert json.dumps(split, sort_keys=True) == json.dumps(
        {"double": {"double": [2.0, 4.0, 6.0]}, "square": {"square": [1.0, 4.0, 9.0]}},
        sort_keys=True,
    )


def test_the_archives_come_from_torchserves_archivers(tmp_path: Path) -> None:
    store = build_workflow_store(tmp_path / "wars")
    import zipfile

    with zipfile.ZipFile(store / "arith.war") as war:
        manifest = json.loads(war.read("WAR-INF/MANIFEST.json"))
    assert manifest["archiverVersion"] == "0.2.15"
    assert manifest["workflow"] == {
        "workflowName": "arith", "specFile": "arith.yaml", "handler": "workflow_handler.py",
    }  # fmt: skip
