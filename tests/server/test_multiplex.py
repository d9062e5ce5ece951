"""Many models per host (``max_loaded_models``, serving/multiplex.py) on a live server: real
uvicorn, real worker processes, real archives (tests/server/assets/load_gate_handler.py).

Which model is loaded, busy or loading is proven by construction: models are registered one by
one through the management API (registration fills the budget in that order), a busy model is
one whose handler waits for a gate file the test creates, and a held load is one whose handler
waits, while loading, for a gate named in its model-config.yaml."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import ASSETS, LiveServer, build_store, make_config, oip_client, until
from .stateful_store import EXAMPLE, archive

# Each test spawns three to five workers, one after another; on a loaded 2-core host one takes
# 20 s or more (an interpreter importing torch).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
HANDLER = str(ASSETS / "load_gate_handler.py")


def _store(factory: pytest.TempPathFactory, prefix: str, yaml: dict[str, str]) -> Path:
    """A store of one load-gate archive per name; ``yaml`` gives some a model-config.yaml."""
    work = factory.mktemp(f"{prefix}-yaml")
    configs = {}
    for name, text in yaml.items():
        configs[name] = work / f"{name}.yaml"
        configs[name].write_text(text)
    names = {"a", "b", "c", "p", *yaml}
    return build_store(factory, prefix, dict.fromkeys(sorted(names), HANDLER), configs)


@pytest.fixture
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LiveServer]]:
    """``serve(yaml, **config)``: a live server over a fresh store, stopped afterwards."""
    servers: list[LiveServer] = []

    def start(yaml: dict[str, str] | None = None, **config: Any) -> LiveServer:
        store = _store(tmp_path_factory, "multiplex", yaml or {})
        config = {"enable_model_api": True, **config}
        servers.append(LiveServer(make_config(store, **config)).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def _register(live: LiveServer, name: str, workers: int = 1) -> None:
    url = f"{live.management_url}/models?url={name}.mar&initial_workers={workers}"
    response = httpx.post(url + "&synchronous=true", timeout=120)
    assert response.status_code == 200, response.text


def _a_and_b_over_a_budget_of_one(serve: Callable[..., LiveServer]) -> LiveServer:
    """A server whose memory budget holds one model, with ``a`` registered and loaded, then
    ``b`` registered past the budget (unloaded)."""
    live = serve(max_loaded_models=1)
    _register(live, "a")
    _register(live, "b")
    return live


def _predict(live: LiveServer, model: str, ident: str, gate: Path | None = None) -> httpx.Response:
    body = {"id": ident, **({"gate": str(gate)} if gate else {})}
    return httpx.post(f"{live.url}/predictions/{model}", json=body, timeout=120)


def _describe(live: LiveServer, model: str) -> dict[str, Any]:
    response = httpx.get(f"{live.management_url}/models/{model}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()[0]


def _loaded(live: LiveServer) -> dict[str, bool]:
    """Each registered model: loaded (describe's ``loaded``)."""
    listed = httpx.get(f"{live.management_url}/models", timeout=30).json()["models"]
    return {m["modelName"]: _describe(live, m["modelName"])["loaded"] for m in listed}


def _series(live: LiveServer) -> dict[tuple[str, str], float]:
    """(sample name, model or "") -> value of the multiplexer's series."""
    text = httpx.get(f"{live.metrics_url}/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "loaded_models" in s.name or s.name.startswith(
                ("torchbay_model_loaded", "torchbay_model_loads", "torchbay_model_evictions")
            ):
                out[(s.name, s.labels.get("model", ""))] = s.value
    return out


def _residency(live: LiveServer, model: str) -> Any:
    registry = live.server.registry
    assert registry is not None and registry.multiplexer is not None
    return registry.multiplexer.residency(registry.resolve(model))


def test_the_third_model_loads_on_its_first_request_and_the_least_recently_used_goes(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(max_loaded_models=2)
    for name in ("a", "b", "c"):
        _register(live, name)
    assert _loaded(live) == {"a": True, "b": True, "c": False}  # c: past the budget
    described = _describe(live, "c")
    assert described["status"] == "READY" and described["loads"] == 0
    # Routable while unloaded: ready (OIP and TorchServe), the server ready and healthy.
    assert httpx.get(f"{live.url}/v2/models/c/ready").status_code == 200
    assert httpx.get(f"{live.url}/v2/health/ready").status_code == 200
    assert httpx.get(f"{live.url}/ping").json()["status"] == "Healthy"

    assert _predict(live, "a", "a1").status_code == 200  # b is now the least recently used
    answer = _predict(live, "c", "c1")
    assert answer.status_code == 200 and answer.json()["id"] == "c1"
    assert _loaded(live) == {"a": True, "b": False, "c": True}
    b, c = _describe(live, "b"), _describe(live, "c")
    assert (b["evictions"], b["loads"], b["workers"]) == (1, 1, [])
    assert (c["evictions"], c["loads"], len(c["workers"])) == (0, 1, 1)

    # Four first requests to the evicted b at once: one load serves them all.
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: _predict(live, "b", f"b{i}"), range(4)))
    assert [r.status_code for r in answers] == [200] * 4
    assert _describe(live, "b")["loads"] == 2
    assert _loaded(live) == {"a": False, "b": True, "c": True}  # a went: least recently used

    live.recorded()
    series = _series(live)
    assert series[("torchbay_model_loaded", "a")] == 0 and series[("torchbay_model_loaded", "b")]
    assert series[("torchbay_model_loads_total", "b")] == 2
    assert series[("torchbay_model_evictions_total", "a")] == 1
    assert series[("torchbay_loaded_models", "")] == 2
    assert series[("torchbay_max_loaded_models", "")] == 2


def test_a_pinned_model_and_a_busy_one_are_never_evicted(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    live = serve({"p": "pinned: true\n"}, max_loaded_models=2)
    _register(live, "p")
    _register(live, "a")
    _register(live, "b")
    assert _predict(live, "a", "a1").status_code == 200  # p is the least recently used...
    assert _predict(live, "b", "b1").status_code == 200  # ...but pinned: a goes
    assert _loaded(live) == {"p": True, "a": False, "b": True}
    assert _describe(live, "p")["pinned"] is True

    gate = tmp_path / "gate"
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(_predict, live, "b", "busy", gate)  # holds b's worker
        until(lambda: live.server.registry.resolve("b").inflight == 1, "b is busy", timeout=60.0)
        waiting = pool.submit(_predict, live, "a", "a2")
        # a's load is under way and cannot make room: p is pinned, b busy; both stay loaded.
        until(lambda: _residency(live, "a").loading is not None, "a's load started", timeout=60.0)
        assert _loaded(live) == {"p": True, "a": False, "b": True}
        assert not waiting.done()
        gate.touch()  # b's request ends: b is idle, a's load evicts it
        assert busy.result().status_code == 200
        assert waiting.result().status_code == 200
    assert _loaded(live) == {"p": True, "a": True, "b": False}
    assert _describe(live, "p")["evictions"] == 0
    assert _describe(live, "b")["evictions"] == 1


def test_a_budget_full_of_pinned_models_refuses_a_load_at_once(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve({"p": "pinned: true\n"}, max_loaded_models=1)
    _register(live, "p")
    _register(live, "a", workers=0)
    refused = _predict(live, "a", "a1")
    assert refused.status_code == 503, refused.text
    assert "are all pinned" in refused.json()["message"]
    assert _loaded(live) == {"p": True, "a": False}
    assert _describe(live, "p")["evictions"] == 0


def test_an_api_registration_that_could_never_load_is_a_507(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve({"p": "pinned: true\n"}, max_loaded_models=1)
    _register(live, "p")
    url = f"{live.management_url}/models?url=a.mar&initial_workers=1&synchronous=true"
    refused = httpx.post(url, timeout=120)
    assert refused.status_code == 507, refused.text
    assert refused.json()["type"] == "InsufficientStorage"
    assert "are all pinned" in refused.json()["message"]
    assert _loaded(live) == {"p": True}  # a is not registered: SageMaker unloads and retries
    httpx.delete(f"{live.management_url}/models/p", timeout=120).raise_for_status()
    _register(live, "a")  # room now
    assert _loaded(live) == {"a": True}


def test_a_load_that_runs_out_of_memory_is_a_507(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    live = serve({"hungry": "loadFails: memory\n", "broken": "loadFails: true\n"})
    url = f"{live.management_url}/models?initial_workers=1&synchronous=true&url="
    hungry = httpx.post(url + "hungry.mar", timeout=120)
    assert hungry.status_code == 507, hungry.text
    assert hungry.json()["message"] == (
        "Model 'hungry.mar' could not be loaded: its worker ran out of memory (MemoryError)"
    )
    broken = httpx.post(url + "broken.mar", timeout=120)  # any other load error: still a 500
    assert broken.status_code == 500, broken.text
    for body in (hungry.text, broken.text):
        assert "Traceback" not in body and str(tmp_path.parent) not in body
    assert httpx.get(f"{live.management_url}/models", timeout=30).json()["models"] == []


def test_a_deadline_that_passes_during_a_load_is_a_504_and_the_load_completes(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    gate = tmp_path / "load-gate"
    yaml = {
        "slow": f"clientTimeoutInMills: 2000\nloadGate: {gate}\n",
        "broken": "loadFails: true\n",
    }
    live = serve(yaml, max_loaded_models=2)
    _register(live, "slow", workers=0)  # registered unloaded: its load would wait for the gate
    _register(live, "broken", workers=0)
    assert _loaded(live) == {"slow": False, "broken": False}

    late = _predict(live, "slow", "s1")  # its load waits for the gate, past 2 s
    assert late.status_code == 504, late.text
    assert _residency(live, "slow").loading is not None  # the load goes on
    gate.touch()
    until(lambda: _residency(live, "slow").loading is None, "slow's load done", timeout=60.0)
    assert _loaded(live)["slow"]
    assert _predict(live, "slow", "s2").status_code == 200
    assert _describe(live, "slow")["loads"] == 1

    # A load that fails answers every waiter with its error; the next request tries again.
    with ThreadPoolExecutor(3) as pool:
        failed = list(pool.map(lambda i: _predict(live, "broken", f"x{i}"), range(3)))
    for response in failed:
        assert response.status_code == 500, response.text
        body = response.text
        assert "fails to load on purpose" in body
        assert "Traceback" not in body and str(tmp_path.parent) not in body
    assert _describe(live, "broken")["loads"] == 1
    assert _predict(live, "broken", "x9").status_code == 500
    broken = _describe(live, "broken")
    assert (broken["loads"], broken["loaded"], broken["status"]) == (2, False, "READY")


def test_without_a_budget_nothing_changes(serve: Callable[..., LiveServer]) -> None:
    live = serve()
    _register(live, "a", workers=0)  # TorchServe's "registered, 503 until scaled"
    assert _predict(live, "a", "a1").status_code == 503
    described = _describe(live, "a")
    assert described["status"] == "STOPPED" and "loaded" not in described
    assert not _series(live)
    assert json.loads(httpx.get(f"{live.url}/ping").text)["status"] == "Healthy"


def test_a_model_scaled_to_zero_while_it_loads_on_demand_is_loaded_again_by_its_request(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    gate = tmp_path / "load-gate"
    live = serve({"slow": f"loadGate: {gate}\n"}, max_loaded_models=1)
    _register(live, "slow", workers=0)
    slow = live.server.registry.resolve("slow")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(_predict, live, "slow", "s1")  # its load waits for the gate
        until(lambda: any(s.worker for s in slow.slots), "slow's load started", timeout=60.0)
        url = f"{live.management_url}/models/slow?min_worker=0&synchronous=true"
        assert httpx.put(url, timeout=120).status_code == 200  # the loading worker is stopped
        gate.touch()
        answer = first.result()
    # The queued request loads it again, as after an eviction; the load under way was not
    # left hanging (it held the model's place of the budget, and every later request waited).
    assert answer.status_code == 200, answer.text
    until(lambda: _residency(live, "slow").loading is None, "slow's load done", timeout=60.0)
    assert _predict(live, "slow", "s2").status_code == 200


def test_a_request_queued_when_its_loaded_model_is_scaled_to_zero_loads_it_again(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """On demand, zero workers is "unloaded": a request queued as the operator scales the
    model to zero loads it again, as the next request and one queued during an eviction do.
    Before, it was answered 503 "has no worker left" while a request a moment later got 200."""
    gate = tmp_path / "gate"
    live = serve(max_loaded_models=2)
    _register(live, "a")
    a = live.server.registry.resolve("a")
    url = f"{live.management_url}/models/a?min_worker=0&synchronous=true"
    with ThreadPoolExecutor(3) as pool:
        busy = pool.submit(_predict, live, "a", "busy", gate)
        until(lambda: a.inflight == 1 and not len(a.queue), "a is busy", timeout=60.0)
        queued = pool.submit(_predict, live, "a", "queued")
        until(lambda: len(a.queue) == 1, "a request waits behind it", timeout=60.0)
        scaling = pool.submit(httpx.put, url, timeout=120)
        # (The scale is answered while a's worker finishes its batch: serving/retiring.py.)
        until(scaling.done, "the scale answered", timeout=60.0)
        gate.touch()
        assert busy.result().status_code == 200  # the batch in hand is finished
        assert scaling.result().status_code == 200, scaling.result().text
        answer = queued.result()
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == "queued"
    assert _describe(live, "a")["loads"] == 2


def test_a_response_cache_hit_of_an_unloaded_model_loads_nothing(
    serve: Callable[..., LiveServer],
) -> None:
    """A hit is answered by the frontend, without a worker (docs/cache.md). Before, the check
    at the request's headers started the model's load before the cache was asked: each hit
    on an unloaded model loaded it and unloaded another to make room."""
    live = serve(max_loaded_models=1)
    for name in ("a", "b"):
        url = f"{live.management_url}/models?url={name}.mar&initial_workers=1"
        answer = httpx.post(url + "&synchronous=true&response_cache=true", timeout=120)
        assert answer.status_code == 200, answer.text
    stored = _predict(live, "a", "x")  # a miss: its answer is stored
    assert _predict(live, "b", "y").status_code == 200  # a, idle, makes room for b
    assert _loaded(live) == {"a": False, "b": True}
    hit = _predict(live, "a", "x")
    assert hit.status_code == 200 and hit.json() == stored.json()  # its worker is gone
    assert _residency(live, "a").loading is None  # (was: loading, b being unloaded for it)
    assert _loaded(live) == {"a": False, "b": True}
    assert (_describe(live, "a")["loads"], _describe(live, "b")["evictions"]) == (1, 0)


def test_a_registration_unregistered_while_its_worker_loads_is_answered(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    gate = tmp_path / "load-gate"
    live = serve({"slow": f"loadGate: {gate}\n"})
    url = f"{live.management_url}/models?url=slow.mar&initial_workers=1&synchronous=true"
    with ThreadPoolExecutor(1) as pool:
        registering = pool.submit(httpx.post, url, timeout=60)  # its worker waits for the gate
        until(lambda: "slow" in live.server.registry.models, "slow registered", timeout=60.0)
        deleted = httpx.delete(f"{live.management_url}/models/slow", timeout=120)
        assert deleted.status_code == 200, deleted.text
        answer = registering.result()  # it was never answered
    assert answer.status_code == 503, answer.text
    assert "stopped (unregistered" in answer.json()["message"]
    gate.touch()
    _register(live, "slow")
    assert _predict(live, "slow", "s1").status_code == 200


def test_a_model_whose_worker_gave_up_loads_again_on_its_next_request(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"  # while it exists, the model's worker fails to load
    yaml = {"a": f"loadFailsOnceExists: {broken}\nmaxRetryTimeoutInSec: 1\n"}
    live = serve(yaml, max_loaded_models=1, restart_backoff_s=(0.2,))
    _register(live, "a")
    slots = live.server.registry.resolve("a").slots
    broken.touch()
    os.kill(live.worker_pids()[0], signal.SIGKILL)  # its restarts fail until it gives up
    until(lambda: any(s.gave_up for s in slots), "a's slot gave up", timeout=120.0)
    broken.unlink()
    answer = httpx.post(f"{live.url}/predictions/a", json={"id": "a1"}, timeout=60)
    assert answer.status_code == 200, answer.text  # was: never answered (it counted as loaded)
    assert _describe(live, "a")["loads"] == 2


def test_a_load_waiting_for_room_makes_none_once_its_model_is_unregistered(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    live = _a_and_b_over_a_budget_of_one(serve)
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(_predict, live, "a", "busy", gate)  # a is busy: no room for b yet
        until(lambda: live.server.registry.resolve("a").inflight == 1, "a is busy", timeout=60.0)
        waiting = pool.submit(_predict, live, "b", "b1")
        until(lambda: _residency(live, "b").loading is not None, "b's load started", timeout=60.0)
        b_residency = _residency(live, "b")
        deleted = httpx.delete(f"{live.management_url}/models/b", timeout=120)
        assert deleted.status_code == 200, deleted.text
        gate.touch()  # a is idle now: the load of the unregistered b must not evict it
        assert busy.result().status_code == 200
        refused = waiting.result()
        assert refused.status_code == 503
        assert "server is shutting down" not in refused.text  # was: only b is unregistered
        assert 'Model "b" version 1.0 is stopping' in refused.json()["message"]
        until(lambda: b_residency.loading is None, "b's load given up", timeout=60.0)
    assert _loaded(live) == {"a": True}
    assert _describe(live, "a")["evictions"] == 0


def test_a_registration_still_loading_is_never_evicted_for_another_load(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    gate = tmp_path / "load-gate"
    live = serve({"slow": f"loadGate: {gate}\n"}, max_loaded_models=1)
    _register(live, "b", workers=0)  # registered unloaded: the budget is empty
    url = f"{live.management_url}/models?url=slow.mar&initial_workers=1&synchronous=true"
    with ThreadPoolExecutor(2) as pool:
        registering = pool.submit(httpx.post, url, timeout=120)  # takes the budget's one place
        until(lambda: "slow" in live.server.registry.models, "slow registered", timeout=60.0)
        slow = live.server.registry.resolve("slow")
        until(lambda: any(s.worker for s in slow.slots), "slow's worker started", timeout=60.0)
        waiting = pool.submit(_predict, live, "b", "b1")  # must wait for slow to be loaded
        until(lambda: _residency(live, "b").loading is not None, "b's load started", timeout=60.0)
        gate.touch()
        answer = registering.result()  # was: 500 "no worker could load the model" (evicted)
        assert answer.status_code == 200, answer.text
        assert waiting.result().status_code == 200  # then slow, idle, makes room for b
    assert _loaded(live) == {"b": True, "slow": False}
    assert _describe(live, "slow")["evictions"] == 1


def test_a_model_being_scaled_up_is_not_evicted_while_its_new_workers_load(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """The operator's scale wins (docs/multiplex.md): a version whose new workers still load
    is not idle. Before, another model's load evicted it meanwhile: the synchronous scale
    answered 206 "Workers scaling in progress..." with nothing in progress and no worker."""
    gate, started = tmp_path / "load-gate", tmp_path / "load-started"
    live = serve({"a": f"loadStarted: {started}\nloadGate: {gate}\n"}, max_loaded_models=1)
    gate.touch()
    _register(live, "a")
    _register(live, "b", workers=0)
    gate.unlink()
    started.unlink()
    url = f"{live.management_url}/models/a?min_worker=2&synchronous=true"
    with ThreadPoolExecutor(2) as pool:
        scaling = pool.submit(httpx.put, url, timeout=120)
        until(started.exists, "a's second worker loads", timeout=60.0)
        waiting = pool.submit(_predict, live, "b", "b1")
        until(
            lambda: _residency(live, "b").loading is not None or waiting.done(),
            "b's load started",
            timeout=60.0,
        )
        gate.touch()
        scaled = scaling.result()
        assert scaled.status_code == 200, scaled.text
        assert scaled.json()["status"] == "Workers scaled to 2 for model: a"
        assert waiting.result().status_code == 200  # then a, idle, makes room for b
    assert _loaded(live) == {"a": False, "b": True}
    assert _describe(live, "a")["evictions"] == 1


def test_a_registration_is_answered_while_a_load_waits_for_a_busy_model(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    live = serve(max_loaded_models=1)
    _register(live, "a")
    _register(live, "b", workers=0)
    gate = tmp_path / "gate"
    url = f"{live.management_url}/models?url=c.mar&initial_workers=1&synchronous=true"
    with ThreadPoolExecutor(3) as pool:
        busy = pool.submit(_predict, live, "a", "busy", gate)  # a is busy: no room for b yet
        until(lambda: live.server.registry.resolve("a").inflight == 1, "a is busy", timeout=60.0)
        waiting = pool.submit(_predict, live, "b", "b1")
        until(lambda: _residency(live, "b").loading is not None, "b's load started", timeout=60.0)
        registering = pool.submit(httpx.post, url, timeout=120)
        # Was: the registration waited, as long as a stayed busy, for the lock b's load held
        # while it waited for room; it is decided at once (no room: registered unloaded).
        until(registering.done, "c's registration answered while a is busy", timeout=90.0)
        assert registering.result().status_code == 200, registering.result().text
        assert not waiting.done()
        gate.touch()
        assert busy.result().status_code == 200
        assert waiting.result().status_code == 200
    assert _loaded(live) == {"a": False, "b": True, "c": False}


def test_a_model_holding_an_open_sequence_is_not_evicted_until_it_ends(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """TorchServe's stateful example (each answer: its sequence's running total, kept in the
    worker) with one worker and a minute's idle limit, beside a load-gate model, budget 1."""
    root = build_store(tmp_path_factory, "multiplex-seq", {"a": HANDLER})
    work = tmp_path_factory.mktemp("multiplex-seq-build")
    config = work / "stateful.yaml"
    text = (EXAMPLE / "sequence_batching" / "model-config.yaml").read_text()
    config.write_text(text.replace(": 2\n", ": 1\n") + "sequenceMaxIdleMSec: 60000\n")
    archive(root, work, "stateful", config)
    live = LiveServer(make_config(root, enable_model_api=True, max_loaded_models=1)).start()
    try:
        _register(live, "stateful")
        _register(live, "a", workers=0)

        def step(value: int, **params: Any) -> httpx.Response:
            data = {"name": "data", "datatype": "BYTES", "shape": [1], "data": [str(value)]}
            body = {"inputs": [data], "parameters": {"sequence_id": 7, **params}}
            return httpx.post(f"{live.url}/v2/models/stateful/infer", json=body, timeout=120)

        def total(response: httpx.Response) -> int:
            assert response.status_code == 200, response.text
            return response.json()["outputs"][0]["data"][0]

        assert total(step(3, sequence_start=True)) == 3
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_predict, live, "a", "a1")
            until(lambda: _residency(live, "a").loading is not None, "a's load", timeout=60.0)
            # Was: a's load unloaded stateful (idle between two requests of its sequence), and
            # the sequence's next request was a 400 "was lost: its worker died or was replaced".
            assert _describe(live, "stateful")["evictions"] == 0
            assert total(step(1)) == 4
            assert not waiting.done()
            assert total(step(4, sequence_end=True)) == 8  # ended: stateful may go now
            assert waiting.result().status_code == 200
        assert _loaded(live) == {"a": True, "stateful": False}
    finally:
        live.stop()


def test_a_triton_repository_load_loads_an_unloaded_model_and_answers_once_loaded(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    live = serve({"broken": "loadFails: true\n"}, max_loaded_models=1)
    _register(live, "a")
    _register(live, "b", workers=0)
    url = f"{live.url}/v2/repository/models/{{}}/load"
    loaded = httpx.post(url.format("b"), json={}, timeout=120)
    assert loaded.status_code == 200, loaded.text
    # Was: 200 with b left unloaded (its first request still a cold start), even with room.
    assert _loaded(live) == {"a": False, "b": True}
    assert _describe(live, "b")["loads"] == 1
    # A model of the store, registered past the budget, is loaded too (the idle b makes room).
    assert httpx.post(url.format("c"), json={}, timeout=120).status_code == 200
    assert _loaded(live) == {"a": False, "b": False, "c": True}
    # One that cannot load is Triton's "failed to load" with its error, and not registered.
    failed = httpx.post(url.format("broken"), json={}, timeout=120)
    assert failed.status_code == 500, failed.text
    message = failed.json()["error"]
    assert message.startswith("failed to load 'broken'") and "on purpose" in message
    assert "Traceback" not in failed.text and str(tmp_path.parent) not in failed.text
    assert "broken" not in _loaded(live)
    # Was "unloaded" in the index, as if nothing had tried: Triton's index gives the error.
    state, reason = _index(live, "http")["broken"]
    assert state == "UNAVAILABLE" and "fails to load on purpose" in reason, reason


def test_a_load_on_demand_that_runs_out_of_memory_is_a_507(
    serve: Callable[..., LiveServer], tmp_path: Path
) -> None:
    live = serve({"hungry": "loadFails: memory\n"}, max_loaded_models=1)
    _register(live, "a")
    _register(live, "hungry")  # past the budget: registered unloaded, its load on demand
    answer = _predict(live, "hungry", "h1")
    # Was: 500 model_load_failed, where its registration with room is a 507 (SageMaker's
    # "unload models and retry"), as docs/sagemaker.md promises "with or without a budget".
    assert answer.status_code == 507, answer.text
    assert answer.json()["type"] == "InsufficientStorage"
    assert answer.json()["message"] == (
        'Model "hungry" could not be loaded: its worker ran out of memory (MemoryError)'
    )
    assert "Traceback" not in answer.text and str(tmp_path.parent) not in answer.text
    assert _describe(live, "hungry")["status"] == "READY"  # registered: the next one tries again


def test_a_model_that_cannot_load_does_not_evict_another_for_every_request(
    serve: Callable[..., LiveServer],
) -> None:
    # The retry of a failed load on demand waits its worker restart back-off: here at once
    # after the first failure, then ten minutes.
    live = serve({"broken": "loadFails: true\n"}, max_loaded_models=2, restart_backoff_s=(0, 600))
    _register(live, "a")
    _register(live, "b")
    _register(live, "broken", workers=0)
    assert _predict(live, "broken", "x1").status_code == 500  # a (least recently used) went
    assert _predict(live, "a", "a1").status_code == 200  # loaded again, in the place left free
    assert _predict(live, "broken", "x2").status_code == 500  # tried again at once: b went
    assert _predict(live, "b", "b1").status_code == 200
    held_off = _predict(live, "broken", "x3")
    # Was: a third load, which unloaded a again (every request to a model that cannot load
    # unloaded a working one, whose next request paid a cold start).
    assert held_off.status_code == 500, held_off.text
    assert "fails to load on purpose" in held_off.json()["message"]
    assert _describe(live, "broken")["loads"] == 2
    assert _loaded(live) == {"a": True, "b": True, "broken": False}
    assert (_describe(live, "a")["evictions"], _describe(live, "b")["evictions"]) == (1, 1)


def _index(live: LiveServer, protocol: str) -> dict[str, tuple[str, str]]:
    """Triton's repository index through tritonclient: name -> (state, reason)."""
    with oip_client(live, protocol) as client:
        index = client.get_model_repository_index()
    if protocol == "grpc":
        return {m.name: (m.state, m.reason) for m in index.models}
    return {m["name"]: (m["state"], m["reason"]) for m in index}


def test_the_repository_index_shows_an_unloaded_model_unavailable_and_a_loaded_one_ready(
    serve: Callable[..., LiveServer],
) -> None:
    live = _a_and_b_over_a_budget_of_one(serve)
    assert _predict(live, "b", "b1").status_code == 200  # a goes for it
    assert _loaded(live) == {"a": False, "b": True}
    unloaded = ("UNAVAILABLE", "unloaded")
    for protocol in ("http", "grpc"):
        # Was: a READY too, though it held no worker (its next request a cold start).
        assert _index(live, protocol)["a"] == unloaded
        assert _index(live, protocol)["b"] == ("READY", "")
    ready = httpx.post(f"{live.url}/v2/repository/index", json={"ready": True}, timeout=30)
    assert [e["name"] for e in ready.json()] == ["b"]
    # Still routable: ready for OIP (multiplex.py's readiness), and its request loads it.
    assert httpx.get(f"{live.url}/v2/models/a/ready").status_code == 200
    assert _predict(live, "a", "a1").status_code == 200
    assert _index(live, "http")["b"] == unloaded


def test_a_customized_describe_of_an_unloaded_model_loads_nothing(
    serve: Callable[..., LiveServer],
) -> None:
    live = _a_and_b_over_a_budget_of_one(serve)
    url = f"{live.management_url}/models/b?customized=true"
    described = httpx.get(url, timeout=120)
    # Was: a read that loaded b, unloading a for it (a's next request a cold start).
    assert described.status_code == 503, described.text
    assert described.json()["message"] == (
        'Model "b" has no worker to serve describe request. '
        "Please use scale workers API to add workers."
    )
    assert _loaded(live) == {"a": True, "b": False}
    assert (_describe(live, "a")["evictions"], _describe(live, "b")["loads"]) == (0, 0)
