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
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import (
    batch_running,
    load_gated_store,
    probe_models,
    recorded,
    recorded_store,
    running,
    until,
)
from tests.server.torchserve_scenarios import assert_torchserve_0_12, comparable, json_call

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve_0.12" / "busy"
busy, RECORD = recorded(DATA, "busy.py")

# step id -> (torchbay's answer, why)
DIFFERENCES: dict[str, tuple[Any, str]] = {
    "held_request": (
        [200, {"ok": True}],
        "an unregister drains its version: the request it runs is answered (TorchServe kills "
        "the worker: 500 'Worker died.', or the request is never answered)",
    ),
}


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    store = recorded_store(tmp_path_factory, "busy-store", busy.ARCHIVES, DATA)
    with running(store, enable_model_api=True) as live, httpx.Client(timeout=120) as client:
        gates = tmp_path_factory.mktemp("busy-gates")
        yield busy.run(json_call(client), live.url, live.management_url, gates)


def test_record_is_torchserve_0_12() -> None:
    assert_torchserve_0_12(RECORD, "busy/record.py")


@pytest.mark.parametrize("step", list(RECORD["answers"]))
def test_same_answers(answers: dict[str, Any], step: str) -> None:
    expected = RECORD["answers"][step]
    if step in DIFFERENCES:
        expected = DIFFERENCES[step][0]
    assert comparable(answers[step]) == comparable(expected), json.dumps(answers[step])


def test_an_unregister_during_an_asynchronous_registration_logs_no_traceback(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The registration's worker is still loading (held by its gate) when its version is
    # unregistered: an operator's ordinary change of mind, answered 200 to both. Was: logged
    # as 'ERROR model gated/1.0 failed to load' with a ShuttingDown traceback.
    store, started = load_gated_store(tmp_path_factory, tmp_path, "busy-gated")
    with running(store, enable_model_api=True) as live:
        m = httpx.Client(base_url=live.management_url, timeout=120)
        params = {"url": "gated.mar", "initial_workers": 1, "synchronous": "false"}
        assert m.post("/models", params=params).status_code == 202
        until(started.exists, "the registration's worker loads", timeout=120)
        with caplog.at_level(logging.INFO, logger="torchbay"):
            r = m.delete("/models/gated/1.0")
            assert r.status_code == 200, r.text
            until(lambda: m.get("/models").json() == {"models": []}, "the version forgotten")
            until(lambda: "before its workers loaded" in caplog.text, "the registration's end")
        m.close()
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    # Nor a warning: the loading worker's kill is ours ('exited with code -9' was one).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_repository_load_during_an_unregister_loads_that_version_again(
    versioned_store: Path, tmp_path: Path
) -> None:
    # probe 1.0 drains (its worker held by a gate) for a TorchServe unregister when a Triton
    # load of probe comes: the load registers every archive of probe, that version again too,
    # once its unregister is done. Was: taken as loaded, it was left out; the load answered
    # 200 and probe 1.0 stayed unloaded.
    gate = tmp_path / "gate"
    with running(versioned_store, enable_model_api=True, models=probe_models()) as live:
        m = httpx.Client(base_url=live.management_url, timeout=120)
        load_url = f"{live.url}/v2/repository/models/probe/load"
        with ThreadPoolExecutor(3) as pool:
            body = {"until": str(gate)}
            held = pool.submit(httpx.post, f"{live.url}/predictions/probe", json=body, timeout=120)
            until(lambda: batch_running(live, "probe"), "the held request runs")
            leaving = pool.submit(m.delete, "/models/probe/1.0")
            until(lambda: m.get("/models/probe/1.0").status_code == 404, "the unregister drains")
            load = pool.submit(httpx.post, load_url, json={}, timeout=120)
            until(lambda: "probe" in live.server.plane.models._turns, "the load under way")
            gate.touch()
            assert held.result().status_code == 200
            assert leaving.result().status_code == 200
            assert load.result().status_code == 200, load.result().text
        index = httpx.post(f"{live.url}/v2/repository/index", json={}, timeout=60).json()
        probe = {(e["version"], e["state"]) for e in index if e["name"] == "probe"}
        assert probe == {("1.0", "READY"), ("2.0", "READY")}
        m.close()


def test_a_version_being_unregistered_is_not_ready_anywhere(
    versioned_store: Path, tmp_path: Path
) -> None:
    # probe 2.0 drains for a TorchServe unregister (its worker held by a gate): its requests
    # are refused 503 'is stopping' and the management API says it is gone, but OIP's model
    # readiness said ready and the repository index READY. Now it is not ready, UNLOADING in
    # the index (Triton's state), and the server stays ready (its other models serve on).
    gate = tmp_path / "gate"
    models = {
        "probe": {
            "1.0": {"marName": "probe.mar", "defaultVersion": True},
            "2.0": {"marName": "probe-v2.mar"},
        }
    }
    with running(versioned_store, enable_model_api=True, models=models) as live:
        m = httpx.Client(base_url=live.management_url, timeout=120)
        with ThreadPoolExecutor(2) as pool:
            body = {"until": str(gate)}
            url = f"{live.url}/predictions/probe/2.0"
            held = pool.submit(httpx.post, url, json=body, timeout=120)
            until(lambda: live.server.registry.resolve("probe", "2.0").inflight == 1, "2.0 busy")
            leaving = pool.submit(m.delete, "/models/probe/2.0")
            until(lambda: m.get("/models/probe/2.0").status_code == 404, "the unregister drains")
            try:
                ready = httpx.get(f"{live.url}/v2/models/probe/versions/2.0/ready", timeout=30)
                index = httpx.post(f"{live.url}/v2/repository/index", json={}, timeout=30).json()
                server_ready = httpx.get(f"{live.url}/v2/health/ready", timeout=30)
            finally:
                gate.touch()
            assert held.result().status_code == 200
            assert leaving.result().status_code == 200
        m.close()
    assert ready.json()["ready"] is False, ready.text
    states = {(e["version"], e["state"]) for e in index if e["name"] == "probe"}
    assert states == {("1.0", "READY"), ("2.0", "UNLOADING")}
    assert server_ready.json() == {"ready": True}


def test_a_scale_and_a_repository_load_of_one_version_take_turns(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    # A synchronous TorchServe scale to 3 waits for its new workers' load (held by a gate)
    # when a Triton load with one instance comes: the load waits for the scale's turn, as a
    # second scale does, then scales to 1. Was: it scaled to 1 across the scale, retiring the
    # workers still loading, and the scale answered 206 'Workers scaling in progress...' for
    # a count the load had undone.
    gate = tmp_path / "gate"
    store, started = load_gated_store(tmp_path_factory, tmp_path, "busy-turns", gate=gate)
    models = {"gated": {"1.0": {"marName": "gated.mar", "minWorkers": 1}}}
    gate.touch()
    with running(store, enable_model_api=True, models=models) as live:
        gate.unlink()
        started.unlink()
        scaled = f"{live.management_url}/models/gated?min_worker=3&synchronous=true"
        one = json.dumps({"instance_group": [{"count": 1}]})
        load = f"{live.url}/v2/repository/models/gated/load"
        with ThreadPoolExecutor(2) as pool:
            scale = pool.submit(httpx.put, scaled, timeout=120)
            until(started.exists, "the new workers' load")
            loading = pool.submit(
                httpx.post, load, json={"parameters": {"config": one}}, timeout=120
            )
            until(lambda: "gated" in live.server.plane.models._turns, "the load under way")
            gate.touch()
            answer = scale.result()
            assert (answer.status_code, answer.json()) == (
                200,
                {"status": "Workers scaled to 3 for model: gated"},
            )
            assert loading.result().status_code == 200, loading.result().text
        [described] = httpx.get(f"{live.management_url}/models/gated", timeout=60).json()
    assert (described["minWorkers"], len(described["workers"])) == (1, 1)
