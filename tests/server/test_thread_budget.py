"""The host budget of CPU threads, live: a real server, two real models, real workers that report
the torch threads and cores they run with. Register, scale and unregister re-share the budget;
live workers are re-tuned in place (same pid)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.server.conftest import LiveServer, build_store, make_config, until
from torchbay.server.config.sources import load_server_config

HANDLER = """
import os

import torch


def handle(data, context):
    if data is None:
        return None
    report = {
        "pid": os.getpid(),
        "threads": torch.get_num_threads(),
        "interop": torch.get_num_interop_threads(),
        "cores": sorted(os.sched_getaffinity(0)),
    }
    return [report for _ in data]
"""


# A handler that says it runs on its GPU (BaseHandler's ``device``): its worker counts as a GPU
# worker on a host whose torch has no CUDA (the GPU itself is injected).
ON_GPU_HANDLER = """
import torch


class OnGpu:
    def initialize(self, context):
        self.device = f"cuda:{context.system_properties['gpu_id']}"

    def handle(self, data, context):
        return [{"threads": torch.get_num_threads()} for _ in data or ()]
"""


@pytest.fixture(scope="module")
def thread_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("threads-handler")
    handler, on_gpu = folder / "threads_handler.py", folder / "on_gpu_handler.py"
    handler.write_text(HANDLER)
    on_gpu.write_text(ON_GPU_HANDLER)
    handlers = {"ta": str(handler), "tb": str(handler), "tg": str(on_gpu)}
    return build_store(tmp_path_factory, "threads", handlers)


@pytest.fixture
def store_server(live_server: Any, thread_store: Path) -> Any:
    def start(**overrides: Any) -> Any:
        return live_server(model_store=thread_store, **overrides)

    return start


def report(server: Any, model: str) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/predictions/{model}", json={}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def describe(server: Any, model: str) -> dict[str, Any]:
    response = httpx.get(f"{server.management_url}/models/{model}", timeout=30)
    assert response.status_code == 200, response.text
    [described] = response.json()
    return described


def threads_of(server: Any, *models: str) -> list[int]:
    return [w["threads"] for m in models for w in describe(server, m)["workers"]]


def test_register_scale_unregister_share_one_budget(store_server: Any) -> None:
    server = store_server(cores=4, enable_model_api=True, load_models=["ta=ta.mar"])
    alone = report(server, "ta")
    assert (alone["threads"], alone["interop"]) == (4, 1)

    registered = httpx.post(
        f"{server.management_url}/models",
        params={"url": "tb.mar", "initial_workers": 1, "synchronous": "true"},
        timeout=60,
    )
    assert registered.status_code == 200, registered.text
    assert threads_of(server, "ta", "tb") == [2, 2]
    shared = report(server, "ta")
    assert shared["pid"] == alone["pid"]  # re-tuned in place, not restarted
    assert (shared["threads"], shared["interop"]) == (2, 1)
    assert report(server, "tb")["threads"] == 2

    scaled = httpx.put(
        f"{server.management_url}/models/tb",
        params={"min_worker": 3, "synchronous": "true"},
        timeout=60,
    )
    assert scaled.status_code == 200, scaled.text
    assert sum(threads_of(server, "ta", "tb")) == 4
    assert threads_of(server, "ta") == [1]
    assert describe(server, "ta")["threadBudget"] == {
        "budget": 4,
        "assigned": 4,
        "overcommitted": False,
        "cores": 4,
    }
    assert report(server, "ta")["threads"] == 1

    gone = httpx.delete(f"{server.management_url}/models/tb", timeout=60)
    assert gone.status_code == 200, gone.text
    assert threads_of(server, "ta") == [4]
    back = report(server, "ta")
    assert (back["pid"], back["threads"]) == (alone["pid"], 4)


def test_configured_budget_and_overcommit_in_describe(store_server: Any) -> None:
    server = store_server(
        cores=4,
        cpu_thread_budget=1,
        models={"ta": {"1.0": {"marName": "ta.mar", "minWorkers": 2, "maxWorkers": 2}}},
        load_models=["ta"],
    )
    described = describe(server, "ta")
    assert [w["threads"] for w in described["workers"]] == [1, 1]
    assert described["threadBudget"]["overcommitted"] is True
    assert described["threadBudget"]["assigned"] == 2
    assert report(server, "ta")["threads"] == 1


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two usable cores to pin two workers apart",
)
def test_affinity_gives_two_models_disjoint_cores(store_server: Any) -> None:
    cores = sorted(os.sched_getaffinity(0))[:2]
    server = store_server(cores=2, cpu_affinity=True, load_models=["ta=ta.mar", "tb=tb.mar"])
    a, b = report(server, "ta"), report(server, "tb")
    assert (a["threads"], b["threads"]) == (1, 1)
    assert sorted(a["cores"] + b["cores"]) == cores  # one core each, not the same one
    pinned = [w["cpuAffinity"] for m in ("ta", "tb") for w in describe(server, m)["workers"]]
    assert sorted(pinned) == [[cores[0]], [cores[1]]]


def test_gpu_workers_take_one_thread_and_nothing_from_the_budget(store_server: Any) -> None:
    # One (injected) GPU: tg is placed on it, tb (deviceType cpu) keeps the whole CPU budget.
    server = store_server(
        cores=2,
        gpu_count=1,
        models={"tb": {"1.0": {"marName": "tb.mar", "deviceType": "cpu"}}},
        load_models=["tg=tg.mar", "tb"],
    )
    gpu, cpu = describe(server, "tg"), describe(server, "tb")
    assert [(w["gpu"], w["threads"]) for w in gpu["workers"]] == [(True, 1)]
    assert [(w["gpu"], w["threads"]) for w in cpu["workers"]] == [(False, 2)]
    assert cpu["threadBudget"]["assigned"] == 2
    assert report(server, "tb")["threads"] == 2


def test_a_gpu_worker_runs_its_declared_cpu_threads(store_server: Any) -> None:
    # cpu_threads is "exactly this many" on a GPU too (a GPU model's CPU preprocessing); it is
    # not taken from the CPU budget, which tb keeps whole.
    server = store_server(
        cores=2,
        gpu_count=1,
        models={
            "tg": {"1.0": {"marName": "tg.mar", "cpu_threads": 3}},
            "tb": {"1.0": {"marName": "tb.mar", "deviceType": "cpu"}},
        },
        load_models=["tg", "tb"],
    )
    assert [(w["gpu"], w["threads"]) for w in describe(server, "tg")["workers"]] == [(True, 3)]
    assert report(server, "tg")["threads"] == 3
    assert threads_of(server, "tb") == [2]


def test_omp_num_threads_in_the_environment_sets_every_workers_threads(
    thread_store: Path, tmp_path: Path
) -> None:
    # TorchServe's workers inherit OMP_NUM_THREADS; here it stands for cpu_threads_per_worker,
    # where the budget alone would give the one worker all 4 (fake) cores.
    local = "http://127.0.0.1:0"
    cli = {"model_store": str(thread_store), "load_models": "ta=ta.mar"}
    cli |= {f"{api}_address": local for api in ("inference", "management", "metrics")}
    cli |= {"grpc_inference_port": 0, "grpc_management_port": 0}
    cli |= {"disable_token_authorization": True}
    config, notes = load_server_config(
        ts_config=None, env={"OMP_NUM_THREADS": "1"}, cli=cli, cwd=tmp_path
    )
    assert "OMP_NUM_THREADS=1: every CPU worker runs 1 intra-op thread(s)" in notes
    server = LiveServer(config, cores=4).start()
    try:
        assert threads_of(server, "ta") == [1]
        assert report(server, "ta")["threads"] == 1
    finally:
        server.stop()


OWN_HANDLER = """
import os

import torch


class OwnThreads:
    def initialize(self, context):
        torch.set_num_threads(1)  # the handler's own choice, as some TorchServe handlers make

    def handle(self, data, context):
        return [{"pid": os.getpid(), "threads": torch.get_num_threads()} for _ in data or ()]
"""


def test_a_handler_that_sets_its_own_threads_keeps_them(
    thread_store: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # TorchServe never touches a worker's threads after its handler loaded; here the budget
    # counts them as configured, never re-tunes them, and describe says what the worker runs.
    handler = tmp_path_factory.mktemp("own-handler") / "own_handler.py"
    handler.write_text(OWN_HANDLER)
    store = build_store(tmp_path_factory, "own", {"own": str(handler)})
    (store / "tb.mar").write_bytes((thread_store / "tb.mar").read_bytes())
    config = make_config(store, enable_model_api=True, load_models=["own.mar"])
    server = LiveServer(config, cores=4).start()
    try:
        assert threads_of(server, "own") == [1]
        registered = httpx.post(
            f"{server.management_url}/models",
            params={"url": "tb.mar", "initial_workers": 1, "synchronous": "true"},
            timeout=60,
        )
        assert registered.status_code == 200, registered.text
        assert threads_of(server, "own", "tb") == [1, 3]  # the rest of the budget
        gone = httpx.delete(f"{server.management_url}/models/tb", timeout=60)
        assert gone.status_code == 200, gone.text
        assert threads_of(server, "own") == [1]
        first = report(server, "own")
        assert first["threads"] == 1
        # Restarted (its Load now says 1, what the handler sets): still the handler's threads.
        os.kill(first["pid"], signal.SIGKILL)
        until(lambda: restarted(server, "own", first["pid"]), "the worker restarted")
        registered = httpx.post(
            f"{server.management_url}/models",
            params={"url": "tb.mar", "initial_workers": 1, "synchronous": "true"},
            timeout=60,
        )
        assert registered.status_code == 200, registered.text
        gone = httpx.delete(f"{server.management_url}/models/tb", timeout=60)
        assert gone.status_code == 200, gone.text
        assert threads_of(server, "own") == [1]
        assert report(server, "own")["threads"] == 1
    finally:
        server.stop()


def restarted(server: Any, model: str, pid: int) -> bool:
    [worker] = describe(server, model)["workers"]
    return worker["status"] == "READY" and worker["pid"] not in (None, pid)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the worker must find no CUDA")
def test_a_worker_given_a_gpu_that_runs_on_the_cpu_takes_a_cpu_share(store_server: Any) -> None:
    # GPUs seen by the server (injected) but no CUDA for torch in the worker (a CPU build of
    # torch on a GPU host): BaseHandler runs on the CPU, as TorchServe's does, so the worker
    # takes its share of the budget instead of a GPU worker's 1 thread.
    server = store_server(cores=4, gpu_count=1, load_models=["ta=ta.mar"])
    [worker] = describe(server, "ta")["workers"]
    assert (worker["gpu"], worker["device"], worker["threads"]) == (True, "cpu", 4)
    assert report(server, "ta")["threads"] == 4
