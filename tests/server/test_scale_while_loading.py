"""Scaling a model down while its workers still load (an asynchronous registration whose
handler's initialize hangs: weights from a dead URL, a lock): the workers still loading are
stopped at once, as TorchServe 0.12 does (it answered 'Workers scaled to 0' in milliseconds to
a synchronous scale while its worker slept in initialize)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from .cli_helpers import wait_gone
from .conftest import load_gated_store, running, until

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
