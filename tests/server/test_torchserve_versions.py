"""TorchServe 0.12 parity for model versions and the management API's finer points, over REST
and gRPC (tests/data/torchserve_0.12/versions: the steps, and what TorchServe 0.12 answered,
made by record.py there), run against a live torchbay and compared.

Compared: every status (HTTP) or status code (gRPC); error messages (HTTP: the body's code and
message; gRPC: the details, less the Java class name TorchServe appends); answers' text and
JSON, describe entries by the values scripts read and their JSON types (an integer stays an
integer). What torchbay does differently on purpose is in DIFFERENCES, each a row of the
README's "Differences from TorchServe".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest

from tests.server.conftest import LiveServer, make_config, recorded, recorded_store
from tests.server.test_torchserve_parity import DESCRIBE_VALUES as PARITY_DESCRIBE

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve_0.12" / "versions"
versions, RECORD = recorded(DATA, "versions.py")
ANSWERS = {a["id"]: a for a in RECORD["answers"]}

_NAME = (
    400,
    "Invalid model name {!r}: letters, digits, '_', '-' and '.' only, starting with a letter or "
    "digit",
)
_LISTED = ["neg", "odd.name-x_1", "rt", "tiny"]
_URLS = {"odd.name-x_1": "odd.mar", "tiny": "tiny-v2.mar"}

# step id -> (torchbay's status, torchbay's body (a describe: its differing values), why): what
# differs on purpose, each a row of the README's "Differences from TorchServe".
DIFFERENCES: dict[str, tuple[Any, Any, str]] = {
    "zeros_describe": (
        200,
        {"batchSize": 1, "maxBatchDelay": 0, "responseTimeout": 120, "startupTimeout": 0},
        "batch_size or response_timeout 0 at registration is the default (TorchServe keeps 0)",
    ),
    "list_token_int32_max": (
        200,
        {"models": []},
        "no nextPageToken past the end (TorchServe's int overflows to a negative token, which "
        "starts the list again: a client paging on would never stop)",
    ),
    "grpc_register_v1_again": (
        "ABORTED",
        "Model version 1.0 is already registered for model tiny",
        "409 as gRPC's ABORTED, as every conflict (TorchServe: UNKNOWN, no details)",
    ),
    "grpc_unregister_default": (
        "PERMISSION_DENIED",
        "Cannot remove default version for model tiny",
        "403 as gRPC's PERMISSION_DENIED (TorchServe: UNKNOWN, no details)",
    ),
    "grpc_predict_missing_version": (
        "NOT_FOUND",
        "Model version: 9.9 does not exist for model: tiny",
        "an unknown model or version is NOT_FOUND on every service (TorchServe's Predictions: "
        "INTERNAL)",
    ),
    "grpc_predict_removed_version": (
        "NOT_FOUND",
        "Model version: 1.0 does not exist for model: tiny",
        "as grpc_predict_missing_version",
    ),
    "grpc_predict_gone": (
        "NOT_FOUND",
        "Model not found: tiny",
        "as grpc_predict_missing_version",
    ),
    "grpc_customized_no_worker": (
        "UNAVAILABLE",
        'Model "odd.name-x_1" has no worker to serve describe request. Please use scale workers '
        "API to add workers.",
        "503 as gRPC's UNAVAILABLE, with its message (TorchServe: INTERNAL, no message)",
    ),
    "grpc_list_limit_unset": (
        "OK",
        {"models": [{"modelName": n, "modelUrl": _URLS.get(n, "tiny.mar")} for n in _LISTED]},
        "ListModels without a limit lists up to 100 (TorchServe: limit 0, an empty page)",
    ),
    "name_space": (
        _NAME[0],
        {"code": 400, "message": _NAME[1].format("a b")},
        "a model name is the archiver's (it names a folder)",
    ),
    "name_leading_dot": (
        _NAME[0],
        {"code": 400, "message": _NAME[1].format(".ab")},
        "as name_space",
    ),
    "name_non_ascii": (
        _NAME[0],
        {"code": 400, "message": _NAME[1].format("\u00e9t\u00e9")},
        "as name_space",
    ),
}

# Describe fields whose values scripts read: the parity test's (less the job queue, which these
# steps do not hold still) and the handler's own description, compared with their JSON types.
DESCRIBE_VALUES = (*(f for f in PARITY_DESCRIBE if f != "jobQueueStatus"), "customizedMetadata")


@pytest.fixture(scope="module")
def versions_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorder's model store, built by torchbay's archiver from the same handler."""
    return recorded_store(tmp_path_factory, "versions-store", versions.ARCHIVES, DATA)


@pytest.fixture(scope="module")
def torchbay_answers(versions_store: Path, ts_stubs: SimpleNamespace) -> Iterator[dict]:
    config = make_config(versions_store, enable_model_api=True, disable_system_metrics=True)
    server = LiveServer(config).start()
    ports = server.server.state.ports
    channels = {
        "inference": grpc.insecure_channel(f"127.0.0.1:{ports.grpc_inference}"),
        "management": grpc.insecure_channel(f"127.0.0.1:{ports.grpc_management}"),
    }
    bases = {"inference": server.url, "management": server.management_url}
    try:
        with httpx.Client(timeout=120) as client:
            yield {
                step["id"]: versions.call(step, client, bases, channels, ts_stubs)
                for step in versions.STEPS
            }
    finally:
        for channel in channels.values():
            channel.close()
        server.stop()


def _same(want: Any, have: Any) -> bool:
    """Equal, and of the same JSON type (1 is not 1.0, nor True)."""
    return want == have and type(want) is type(have)


def compare(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """What differs between TorchServe's answer and torchbay's (empty: parity)."""
    if expected["status"] != got["status"]:
        return [f"status: TorchServe {expected['status']}, torchbay {got['status']}"]
    want, have = expected["body"], got["body"]
    if isinstance(want, dict) and {"code", "message"} <= set(want):
        # HTTP errors: the code and the message ("type" is torchbay's exception name).
        if not isinstance(have, dict) or set(have) != set(want):
            return [f"error body {have!r}"]
        keys = ("code", "message")
        return [] if all(want[k] == have[k] for k in keys) else [f"error: {want} vs {have}"]
    if isinstance(want, list) and want and isinstance(want[0], dict) and "modelName" in want[0]:
        return _compare_describe(want, have)
    return [] if _same(want, have) else [f"body: TorchServe {want!r}, torchbay {have!r}"]


def _compare_describe(expected: list[dict[str, Any]], got: Any) -> list[str]:
    if not isinstance(got, list) or len(got) != len(expected):
        return [f"describe: {len(expected)} entries expected, got {got!r}"]
    problems = []
    for want, have in zip(expected, got, strict=True):
        problems += [
            f"{key}: TorchServe {want.get(key)!r}, torchbay {have.get(key)!r}"
            for key in DESCRIBE_VALUES
            if not _same(want.get(key), have.get(key))
        ]
        statuses = [w.get("status") for w in have.get("workers", [])]
        if statuses != [w["status"] for w in want["workers"]]:
            problems.append(f"workers: TorchServe {want['workers']}, torchbay {statuses}")
    return problems


def _compare_difference(
    answer: dict[str, Any], got: dict[str, Any], status: Any, body: Any
) -> list[str]:
    """torchbay's answer is the one DIFFERENCES names: a describe is TorchServe's with the
    values named replaced; an error body, its code and message."""
    if isinstance(answer["body"], list):
        expected = {**answer, "body": [{**answer["body"][0], **body}]}
        return compare(expected, got)
    if isinstance(body, dict) and "message" in body:
        body = {**body, "type": got["body"].get("type") if isinstance(got["body"], dict) else None}
    return [] if (got["status"], got["body"]) == (status, body) else [repr(got)]


def test_record_is_torchserve_0_12() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert RECORD["command"].endswith("tests/data/torchserve_0.12/versions/record.py")
    assert [a["id"] for a in RECORD["answers"]] == [s["id"] for s in versions.STEPS]


def test_same_answers(torchbay_answers: dict[str, dict[str, Any]]) -> None:
    problems = {}
    for step_id, answer in ANSWERS.items():
        got = torchbay_answers[step_id]
        if step_id in DIFFERENCES:
            found = _compare_difference(answer, got, *DIFFERENCES[step_id][:2])
        else:
            found = compare(answer, got)
        if found:
            problems[step_id] = found
    assert not problems, json.dumps(problems, indent=1, ensure_ascii=False)
