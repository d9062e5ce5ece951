"""TorchServe 0.12 parity: the management and inference call sequence TorchServe users script
(tests/data/torchserve_0.12/sequence.py), run against a live torchbay and compared with what
TorchServe 0.12 answered to the same calls (answers.json, made by record.py there).

Compared: every status code; error bodies' keys, code and message; status messages; list
bodies; describe entries' TorchServe keys and the values scripts read; prediction bodies; the
Prometheus text of TorchServe's frontend families (types, label names and order, request
counts). What torchbay does differently on purpose is listed in DIFFERENCES (and in the README's
"Differences from TorchServe" table), step by step.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import _tiny_model, recorded, recorded_store
from torchbay.archiver.package import ArchiveOptions, package

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve_0.12"
sequence, RECORD = recorded(DATA, "sequence.py")
ANSWERS = {a["id"]: a for a in RECORD["answers"]}

# step id -> (torchbay's status, the describe fields that differ with torchbay's values, or None
# for an error body whose code and message differ, why). Each is a row of the README's
# "Differences from TorchServe".
DIFFERENCES: dict[str, tuple[int, dict[str, Any] | None, str]] = {
    "describe_negative_numbers": (
        200,
        {"maxBatchDelay": 100},
        "a negative max_batch_delay falls back to the default (TorchServe keeps -1)",
    ),
    "scale_negative_min_worker": (
        400,
        None,
        "a negative min_worker is a 400 (TorchServe: 500 IndexOutOfBoundsException)",
    ),
}
# step id -> the part of TorchServe's error message torchbay's starts with, why not all of it.
MESSAGE_PREFIX = {
    # TorchServe's message is wrong ("Model name is not defined."): torchbay says what it is.
    "register_not_an_archive": "",
    # TorchServe goes on about sequence batching, which torchbay does not have.
    "predict_no_worker": 'Model "tiny" has no worker to serve inference request. '
    "Please use scale workers API to add workers.",
}

# Describe fields whose values scripts read: compared as recorded.
DESCRIBE_VALUES = (
    "modelName", "modelVersion", "modelUrl", "runtime", "minWorkers", "maxWorkers", "batchSize",
    "maxBatchDelay", "responseTimeout", "startupTimeout", "maxRetryTimeoutInSec",
    "clientTimeoutInMills", "loadedAtStartup", "jobQueueStatus",
)  # fmt: skip
WORKER_VALUES = ("status", "gpu")
# TorchServe's frontend metric families, compared by type, labels and (counts) value.
TS_FAMILIES = (
    "ts_inference_requests_total", "ts_inference_latency_microseconds",
    "ts_queue_latency_microseconds", "Requests2XX", "Requests4XX", "Requests5XX", "QueueTime",
    "WorkerThreadTime", "PredictionTime",
)  # fmt: skip


@pytest.fixture(scope="module")
def parity_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorder's model store, built by torchbay's archiver from the same handler files."""
    root = recorded_store(tmp_path_factory, "parity-store", sequence.ARCHIVES, DATA)
    (root / sequence.NOT_AN_ARCHIVE).write_text("this is not a model archive\n")
    return root


def _call(client: httpx.Client, bases: dict[str, str], step: dict[str, Any]) -> httpx.Response:
    body = step.get("body")
    headers = {"content-type": "text/plain"} if body is not None else {}
    return client.request(
        step["method"], bases[step["listener"]] + step["path"], content=body, headers=headers
    )


def run_sequence(bases: dict[str, str]) -> tuple[dict[str, dict[str, Any]], Counter[int]]:
    """Every step's (status, normalised body), and the status classes of the calls made before
    the metrics step (TorchServe's Requests2XX/4XX/5XX count them)."""
    seen: dict[str, dict[str, Any]] = {}
    classes: Counter[int] = Counter()
    with httpx.Client(timeout=120) as client:
        for step in sequence.STEPS:
            deadline = time.monotonic() + 60
            while True:
                response = _call(client, bases, step)
                if step["listener"] != sequence.X:
                    classes[response.status_code // 100] += 1
                body = sequence.normalise(
                    step, response.headers.get("content-type", ""), response.content
                )
                if step.get("until") != "ready" or sequence.ready(body):
                    break
                assert time.monotonic() < deadline, f"{step['id']}: never ready: {body}"
                time.sleep(0.2)
            seen[step["id"]] = {"status": response.status_code, "body": body}
            if step["listener"] == sequence.X:
                seen[step["id"]]["classes"] = dict(classes)
    return seen, classes


def compare_body(step_id: str, expected: Any, got: Any) -> list[str]:
    """What differs between TorchServe's and torchbay's body for one step (empty: parity)."""
    if isinstance(expected, dict) and "code" in expected and "message" in expected:
        # The keys, the code and the message; "type" is torchbay's exception name (ModelNotFound,
        # not ModelNotFoundException): scripts read the code and the message.
        if not isinstance(got, dict) or set(got) != set(expected):
            return [f"error body keys {sorted(got) if isinstance(got, dict) else got!r}"]
        if step_id in DIFFERENCES:
            return []  # the status differs on purpose: so do the code and the message
        problems = [] if expected["code"] == got["code"] else [f"code {got['code']}"]
        prefix = MESSAGE_PREFIX.get(step_id)
        same = got["message"] == expected["message"]
        if not (same if prefix is None else got["message"].startswith(prefix)):
            problems.append(
                f"message: TorchServe {expected['message']!r}, torchbay {got['message']!r}"
            )
        return problems
    if isinstance(expected, list) and expected and "modelName" in expected[0]:
        return _compare_describe(expected, got)
    if isinstance(expected, dict) and "types" in expected:
        return []  # metrics: compare_metrics
    return [] if expected == got else [f"body: TorchServe {expected!r}, torchbay {got!r}"]


def _compare_describe(expected: list[dict[str, Any]], got: Any) -> list[str]:
    if not isinstance(got, list) or len(got) != len(expected):
        return [f"describe: {len(expected)} entries expected, got {got!r}"]
    problems = []
    for want, have in zip(expected, got, strict=True):
        missing = sorted(set(want) - set(have))
        if missing:
            problems.append(f"describe keys missing: {missing}")
        for key in DESCRIBE_VALUES:
            if want.get(key) != have.get(key):
                problems.append(f"{key}: TorchServe {want.get(key)!r}, torchbay {have.get(key)!r}")
        workers = [[w.get(k) for k in WORKER_VALUES] for w in have.get("workers", [])]
        if workers != [[w[k] for k in WORKER_VALUES] for w in want["workers"]]:
            problems.append(f"workers: TorchServe {want['workers']}, torchbay {workers}")
    return problems


def compare_metrics(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    problems = []
    for family in TS_FAMILIES:
        if expected["types"].get(family) != got["types"].get(family):
            problems.append(
                f"TYPE {family}: TorchServe {expected['types'].get(family)}, "
                f"torchbay {got['types'].get(family)}"
            )
        want = sorted([s[1], s[2]] for s in expected["samples"] if s[0] == family)
        have = sorted([s[1], s[2]] for s in got["samples"] if s[0] == family)
        if family.startswith("Requests"):
            continue  # counted against the calls made: below
        if want != have:
            problems.append(f"{family}: TorchServe {want}, torchbay {have}")
    return problems


@pytest.fixture(scope="module")
def torchbay_answers(parity_store: Path) -> dict[str, dict[str, Any]]:
    from tests.server.conftest import LiveServer, make_config

    config = make_config(parity_store, enable_model_api=True, disable_system_metrics=True)
    server = LiveServer(config).start()
    try:
        bases = {
            sequence.INF: server.url,
            sequence.M: server.management_url,
            sequence.X: server.metrics_url,
        }
        seen, _ = run_sequence(bases)
    finally:
        server.stop()
    return seen


def test_record_is_torchserve_0_12() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert RECORD["command"].endswith("tests/data/torchserve_0.12/record.py")
    assert [a["id"] for a in RECORD["answers"]] == [s["id"] for s in sequence.STEPS]


def test_same_status_codes(torchbay_answers: dict[str, dict[str, Any]]) -> None:
    wrong = {
        step_id: (answer["status"], torchbay_answers[step_id]["status"])
        for step_id, answer in ANSWERS.items()
        if torchbay_answers[step_id]["status"] != DIFFERENCES.get(step_id, (answer["status"],))[0]
    }
    assert not wrong, f"step: (TorchServe, torchbay) {wrong}"


def test_same_bodies(torchbay_answers: dict[str, dict[str, Any]]) -> None:
    problems = {}
    for step_id, answer in ANSWERS.items():
        expected = answer["body"]
        override = DIFFERENCES.get(step_id, (0, None))[1]
        if override is not None:  # the named difference, on a copy of TorchServe's answer
            expected = [{**expected[0], **override}]
        found = compare_body(step_id, expected, torchbay_answers[step_id]["body"])
        if found:
            problems[step_id] = found
    assert not problems, json.dumps(problems, indent=1)


def test_same_metrics(torchbay_answers: dict[str, dict[str, Any]]) -> None:
    got = torchbay_answers["metrics"]
    assert compare_metrics(ANSWERS["metrics"]["body"], got["body"]) == []
    counts = {s[0]: s[2] for s in got["body"]["samples"] if s[0].startswith("Requests")}
    classes = got["classes"]
    # TorchServe counts every answer on the inference and management listeners (its record:
    # each step's calls plus the recorder's start-up /ping).
    assert counts == {f"Requests{c}XX": float(classes.get(c, 0)) for c in (2, 4, 5)}


def test_loaded_at_startup_and_ping_as_torchserve(parity_store: Path) -> None:
    """describe's loadedAtStartup is true only for start-up models; /ping counts a worker that
    is still loading healthy, as TorchServe 0.12 does (ApiUtils.isModelHealthy over
    WorkerThread.isHealthy: tests/data/torchserve/ping)."""
    from tests.server.conftest import LiveServer, make_config

    config = make_config(
        parity_store, enable_model_api=True, load_models=["tiny.mar"], disable_system_metrics=True
    )
    server = LiveServer(config).start()
    try:
        with httpx.Client(base_url=server.management_url, timeout=120) as m:
            assert m.get("/models/tiny").json()[0]["loadedAtStartup"] is True
            r = m.post("/models", params={"url": "slow.mar", "initial_workers": 1})
            assert r.status_code == 200, r.text
            assert m.get("/models/slow").json()[0]["loadedAtStartup"] is False
            ping = httpx.get(f"{server.url}/ping")
            assert (ping.status_code, ping.json()) == (200, {"status": "Healthy"})
            # A second slow worker is loading (its import sleeps): 1 READY of min 2. Was 500
            # Unhealthy (a probe took the server out of service for one model's scale-up),
            # where TorchServe 0.12 answers 200 Healthy (tests/data/torchserve/ping).
            assert m.put("/models/slow", params={"min_worker": 2}).status_code == 202
            ping = httpx.get(f"{server.url}/ping")
            assert (ping.status_code, ping.json()) == (200, {"status": "Healthy"})
            deadline = time.monotonic() + 60
            while (
                not sequence.ready(m.get("/models/slow").json())
                or len(m.get("/models/slow").json()[0]["workers"]) < 2
            ):
                assert time.monotonic() < deadline, m.get("/models/slow").text
                time.sleep(0.2)
            assert httpx.get(f"{server.url}/ping").status_code == 200
    finally:
        server.stop()


def test_synchronous_scale_that_fails_is_500_as_torchserve(
    parity_store: Path, tmp_path: Path
) -> None:
    """TorchServe 0.12 (ApiUtils.updateModelWorkers) answers a synchronous scale whose workers
    could not start 500 "Failed to start workers for model m version: v"; nothing else is 500."""
    from tests.server.conftest import LiveServer, make_config

    handler = tmp_path / "broken_handler.py"
    handler.write_text('raise RuntimeError("this handler cannot load")\n')
    store = tmp_path / "store"
    shutil.copytree(parity_store, store)
    package(
        ArchiveOptions(
            model_name="broken",
            version="1.0",
            serialized_file=_tiny_model(tmp_path / "model.pt"),
            handler=str(handler),
            export_path=store,
        )
    )
    server = LiveServer(make_config(store, enable_model_api=True)).start()
    try:
        with httpx.Client(base_url=server.management_url, timeout=120) as m:
            assert m.post("/models", params={"url": "broken.mar"}).status_code == 200
            r = m.put("/models/broken", params={"min_worker": 1, "synchronous": "true"})
            assert r.status_code == 500, r.text
            assert r.json() == {
                "code": 500,
                "type": "TorchbayError",
                "message": "Failed to start workers for model broken version: 1.0",
            }
            assert m.get("/models/broken").json()[0]["workers"] == []
    finally:
        server.stop()
