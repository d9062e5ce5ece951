"""Scaling a model down while its workers still load (an asynchronous registration whose
handler's initialize hangs: weights from a dead URL, a lock): the workers still loading are
stopped at once, as TorchServe 0.12 does (it answered 'Workers scaled to 0' in milliseconds to
a synchronous scale while its worker slept in initialize). Workers that run a batch: the scale
is answered at once too, as TorchServe's, and they finish their batch before they stop."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from .cli_helpers import wait_gone
from .conftest import ASSETS, build_store, load_gated_store, running, until

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("initial", "scaled"), [(1, 0), (2, 1)])
def test_scaling_down_while_a_worker_loads_stops_it_at_once(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, initial: int, scaled: int
) -> None:
    """The scale waited for the load (up to startupTimeout + 5 s: 125 s by default) before
    counting the workers, and only then stopped them; here each load is held 60 s by its gate
    (assets/gates.py), past the client's 45 s. TorchServe answers a scale down 200 at once,
    whether the workers left have loaded or not."""
    store, started = load_gated_store(tmp_path_factory, tmp_path, "scale-loading", "slow")
    with running(store, enable_model_api=True) as server:
        management = server.management_url
        params = {"url": "slow.mar", "initial_workers": initial, "synchronous": "false"}
        assert httpx.post(f"{management}/models", params=params, timeout=60).status_code == 202
        until(lambda: len(server.worker_pids()) == initial, "the workers to start", timeout=60)
        until(started.exists, "a worker to start loading", timeout=60)
        pids = server.worker_pids()
        scale = {"min_worker": scaled, "synchronous": "true"}
        r = httpx.put(f"{management}/models/slow", params=scale, timeout=45)
        assert r.status_code == 200, r.text
        assert r.json() == {"status": f"Workers scaled to {scaled} for model: slow"}
        assert wait_gone(pids[-1], 30), "the worker still loading was not stopped"
        [described] = httpx.get(f"{management}/models/slow", timeout=30).json()
        assert described["minWorkers"] == scaled
        assert [w["pid"] for w in described["workers"]] == pids[:scaled]


def test_scaling_down_busy_workers_answers_at_once_and_their_requests_finish(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """A synchronous scale down waited for the batch of each worker it stopped (a generation
    of minutes, up to responseTimeout); TorchServe 0.12 answers it 200 at once (and answers
    the request that worker ran 500 "Worker died."). The worker leaving finishes its batch,
    its request answered 200, and takes no other; describe shows it DRAINING meanwhile."""
    handler = str(ASSETS / "load_gate_handler.py")
    store = build_store(tmp_path_factory, "scale-busy", {"held": handler})
    gate = tmp_path / "gate"
    with running(store, enable_model_api=True) as server, ThreadPoolExecutor(2) as pool:
        model = f"{server.management_url}/models/held"
        params = {"url": "held.mar", "initial_workers": 2, "synchronous": "true"}
        r = httpx.post(f"{server.management_url}/models", params=params, timeout=120)
        assert r.status_code == 200, r.text
        url, body = f"{server.url}/predictions/held", {"gate": str(gate)}
        held = [pool.submit(httpx.post, url, json={**body, "id": i}, timeout=120) for i in "ab"]

        def states() -> list[str]:
            return [w["state"] for w in httpx.get(model, timeout=30).json()[0]["workers"]]

        until(lambda: states() == ["BUSY", "BUSY"], "both workers run a batch", timeout=60)
        scale = {"min_worker": 1, "synchronous": "true"}
        r = httpx.put(model, params=scale, timeout=45)  # each batch is held 60 s by its gate
        assert r.status_code == 200, r.text
        assert r.json() == {"status": "Workers scaled to 1 for model: held"}
        workers = httpx.get(model, timeout=30).json()[0]["workers"]
        [leaving] = [w for w in workers if w["state"] == "DRAINING"]
        assert leaving["status"] == "UNLOADING"
        gate.touch()
        assert sorted(f.result().json()["id"] for f in held) == ["a", "b"]
        assert wait_gone(leaving["pid"], 30), "the worker scaled down was not stopped"
        until(lambda: states() == ["READY"], "one worker left", timeout=30)
