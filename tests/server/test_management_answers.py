"""The management API's answers on a live server where torchbay once answered otherwise than
TorchServe 0.12, or than its own settings say: an unregister that meets a busy worker, and what a
describe of the handler (``?customized=true``) counts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.server.conftest import (
    build_store,
    load_gated_store,
    recorded,
    recorded_store,
    running,
    until,
)
from tests.server.torchserve_scenarios import assert_torchserve_0_12, comparable, json_call

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve_0.12"
GATE = DATA / "busy" / "gate_handler.py"  # a request {"started", "gate"} waits for its gate
scenario, RECORD = recorded(DATA / "answers", "scenario.py")

# step id -> (torchbay's answer, why): each a row of the README's "Differences from TorchServe"
DIFFERENCES: dict[str, tuple[Any, str]] = {
    "second_request": (
        [503, "ShuttingDown"],
        "an unregister drains its version (up to unregister_model_timeout), then answers what is "
        "left 503; TorchServe kills the worker: 500 'Worker died.', or no answer at all",
    ),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory, "answers-store", {"m": str(GATE)})


@pytest.fixture
def live(store: Path) -> Iterator[SimpleNamespace]:
    config = {"enable_model_api": True, "unregister_model_timeout_s": 1}
    with running(store, **config) as server, httpx.Client(timeout=120) as client:
        yield SimpleNamespace(server=server, http=client)


def _register(live: SimpleNamespace) -> None:
    url = f"{live.server.management_url}/models"
    params = {"url": "m.mar", "initial_workers": "1", "synchronous": "true"}
    assert live.http.post(url, params=params).status_code == 200


def _held(
    live: SimpleNamespace, pool: ThreadPoolExecutor, started: Path, gate: Path
) -> Future[httpx.Response]:
    """POST /predictions/m in ``pool``: a request the gate handler holds (it creates ``started``
    when it runs it, then waits until ``gate`` exists)."""
    hold = json.dumps({"started": str(started), "gate": str(gate)})
    return pool.submit(
        live.http.post,
        f"{live.server.url}/predictions/m",
        content=hold,
        headers={"content-type": "application/json"},
    )


def test_unregister_of_a_busy_worker_ends_within_unregister_model_timeout(
    live: SimpleNamespace, tmp_path: Path
) -> None:
    """``unregister_model_timeout=1`` and a request the handler holds (its gate shut): the
    unregister drained 1 s, answered the request 503, then waited the worker stop's fixed 10 s
    grace for a worker that was still running it: 11 s and more. TorchServe kills the worker at
    once (200 in well under a second, tests/data/torchserve_0.12/busy); torchbay now stops a
    worker whose requests are all answered at once after its drain."""
    _register(live)
    started, gate = tmp_path / "started", tmp_path / "gate"
    with ThreadPoolExecutor(1) as pool:
        held = _held(live, pool, started, gate)
        try:
            deadline = time.monotonic() + 60
            while not started.exists():  # the handler runs the request (and holds it)
                assert time.monotonic() < deadline, "the held request never started"
                time.sleep(0.01)
            began = time.monotonic()
            gone = live.http.delete(f"{live.server.management_url}/models/m")
            took = time.monotonic() - began
        finally:
            gate.touch()  # the handler's wait ends either way (60 s at most otherwise)
        assert (gone.status_code, gone.json()) == (200, {"status": 'Model "m" unregistered'})
        assert took < 8, f"the unregister took {took:.1f} s with unregister_model_timeout=1"
        answered = held.result()
    assert answered.status_code == 503, answered.text
    assert answered.json()["type"] == "ShuttingDown"
    assert live.http.get(f"{live.server.management_url}/models/m").status_code == 404


def _counts(live: SimpleNamespace) -> tuple[int, int, float]:
    """m's Triton statistics (inference_count, execution_count) and torchbay's batch count."""
    stats = live.http.get(f"{live.server.url}/v2/models/m/stats").json()["model_stats"][0]
    metrics = live.http.get(f"{live.server.metrics_url}/metrics").text
    batches = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('torchbay_batch_size_count{model="m"')
    ]
    return stats["inference_count"], stats["execution_count"], sum(batches)


def test_a_customized_describe_is_no_inference(live: SimpleNamespace) -> None:
    """``GET /models/m?customized=true`` runs the handler's describe on a worker. TorchServe
    counts it in no inference metric (ts_inference_requests_total, its latencies: probed);
    torchbay counted it as an executed batch: Triton's statistics said execution_count 2 with
    inference_count 0 after two describes, and torchbay_batch_size counted them."""
    _register(live)
    for _ in range(2):
        described = live.http.get(
            f"{live.server.management_url}/models/m", params={"customized": "true"}
        )
        assert described.status_code == 200, described.text
        assert described.json()[0]["customizedMetadata"] == {"ok": True}
    assert _counts(live) == (0, 0, 0.0)
    answered = live.http.post(f"{live.server.url}/predictions/m", content=b"{}")
    assert answered.status_code == 200, answered.text
    until(lambda: _counts(live) == (1, 1, 1.0), "the inference counted")  # it still counts


def test_a_busy_worker_is_described_ready_as_torchserve_does(
    live: SimpleNamespace, tmp_path: Path
) -> None:
    """TorchServe's describe says a worker's ``status`` is ``READY`` (loaded: idle or running
    a request) or ``UNLOADING`` (anything else); torchbay said ``BUSY`` while it ran a request,
    so a script waiting for, or alerting on, every worker READY (benchmarks/managed.py's own
    wait, a readiness probe over describe) saw a loaded model as not ready under load.
    torchbay's finer state is ``state``."""
    _register(live)
    started, gate = tmp_path / "started", tmp_path / "gate"
    describe = f"{live.server.management_url}/models/m"
    with ThreadPoolExecutor(1) as pool:
        held = _held(live, pool, started, gate)
        try:
            until(started.exists, "the held request started", timeout=60)
            [worker] = live.http.get(describe).json()[0]["workers"]
        finally:
            gate.touch()
        assert held.result().status_code == 200
    assert worker["status"] == "READY", worker
    assert worker["state"] == "BUSY"
    live.http.put(describe, params={"min_worker": "2"})  # asynchronous: one worker starts
    until(lambda: len(live.http.get(describe).json()[0]["workers"]) == 2, "a second worker", 60)
    statuses = {(w["status"], w["state"]) for w in live.http.get(describe).json()[0]["workers"]}
    assert statuses <= {("READY", "READY"), ("UNLOADING", "STARTING")}, statuses


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """scenario.py's answers from torchbay, configured as the recorder configured TorchServe."""
    data = DATA / "answers"
    store = recorded_store(tmp_path_factory, "answers-rec", scenario.ARCHIVES, data)
    config = {"unregister_model_timeout_s": scenario.UNREGISTER_TIMEOUT_S}
    with running(store, enable_model_api=True, **config) as live, httpx.Client(timeout=120) as c:
        gates = tmp_path_factory.mktemp("answers-gates")
        urls = live.url, live.management_url, live.metrics_url
        return scenario.run(json_call(c), *urls, gates)


def test_record_is_torchserve_0_12() -> None:
    assert_torchserve_0_12(RECORD, "answers/record.py")


@pytest.mark.parametrize("step", list(RECORD["answers"]))
def test_same_answers_as_torchserve(answers: dict[str, Any], step: str) -> None:
    ours = answers[step]
    if step in DIFFERENCES:
        status, kind = DIFFERENCES[step][0]
        assert [ours[0], ours[1]["type"]] == [status, kind], ours
        return
    assert comparable(ours) == comparable(RECORD["answers"][step])


def test_unregister_meets_a_scale_still_loading_at_once(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """A synchronous scale whose worker is still loading, then DELETE of that version:
    TorchServe 0.12 unregisters at once (200 in 0.2 s, probed) and the scale answers 500; the
    unregister waited for the scale's load to end (the version's management lock), here a load
    held by its gate: as long as a big model takes to load. Now it stops the loading worker and
    answers at once; the scale answers 503 (stopped before its workers loaded)."""
    gate = tmp_path / "gate"
    store, started = load_gated_store(tmp_path_factory, tmp_path, "unreg-scale", gate=gate)
    with running(store, enable_model_api=True) as live, httpx.Client(timeout=120) as c:
        models = f"{live.management_url}/models"
        assert c.post(models, params={"url": "gated.mar"}).status_code == 200  # no worker
        with ThreadPoolExecutor(1) as pool:
            scaling = pool.submit(
                c.put, f"{models}/gated", params={"min_worker": "1", "synchronous": "true"}
            )
            try:
                until(started.exists, "the scale's worker is loading", timeout=60)
                gone = c.delete(f"{models}/gated", timeout=30)  # before: past the gate's 60 s
            finally:
                gate.touch()
            scaled = scaling.result()
        assert (gone.status_code, gone.json()) == (200, {"status": 'Model "gated" unregistered'})
        assert scaled.status_code == 503, scaled.text
        assert c.get(f"{models}/gated").status_code == 404
        assert c.get(models).json()["models"] == []
