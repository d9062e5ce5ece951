"""Workers forked from the worker template (serving/forkserver.py, worker/template.py), live: a
real server, real template and worker processes, a real model. Scale-up, a restart after kill -9
and recycling all fork; the thread budget, a fresh torch (no CUDA, its own thread pools) and the
worker's own environment hold in the child; a dead template means a spawned worker and a new
template, never a missing worker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.server.conftest import build_store, until
from torchbay.server.serving import forkserver
from torchbay.server.serving.forkserver import ForkedProc, ForkServer, supported
from torchbay.server.serving.worker_env import start_worker, worker_env

pytestmark = pytest.mark.skipif(not supported(), reason="needs fork, pidfds and SCM_RIGHTS")

HANDLER = """
import os

import torch


def handle(data, context):
    if data is None:
        return None
    print(f"fork-test print from {os.getpid()}")  # block-buffered: a pipe, or pytest's file
    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "threads": torch.get_num_threads(),
        "interop": torch.get_num_interop_threads(),
        "cuda_initialized": torch.cuda.is_initialized(),
        "marker": os.environ.get("TORCHBAY_FORK_TEST_MARKER"),
        "sum": float(torch.ones(64, 64).matmul(torch.ones(64, 64)).sum()),
    }
    return [report for _ in data]
"""

READY_S = 120  # the template's own torch import, on a loaded 2-core host


@pytest.fixture(scope="module")
def fork_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    handler = tmp_path_factory.mktemp("fork-handler") / "fork_handler.py"
    handler.write_text(HANDLER)
    return build_store(tmp_path_factory, "fork", {"forked": str(handler)})


@pytest.fixture
def forking(live_server: Any, fork_store: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Start a server over ``fork_store`` and wait until its template can fork."""
    monkeypatch.setenv("TORCHBAY_FORK_TEST_MARKER", "from-the-server")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # the print test needs a buffer

    def start(**overrides: Any) -> Any:
        server = live_server(model_store=fork_store, load_models=["forked=forked.mar"], **overrides)
        assert server.server.forks.wait_ready(READY_S), "the worker template did not start"
        return server

    return start


def report(server: Any) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/predictions/forked", json={}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def reports(server: Any, n: int) -> list[dict[str, Any]]:
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            url = f"{server.url}/predictions/forked"
            return await asyncio.gather(*(client.post(url, json={}) for _ in range(n)))

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * n, [r.text for r in responses]
    return [r.json() for r in responses]


def scale(server: Any, workers: int) -> None:
    scaled = httpx.put(
        f"{server.management_url}/models/forked",
        params={"min_worker": workers, "max_worker": workers, "synchronous": "true"},
        timeout=120,
    )
    assert scaled.status_code == 200, scaled.text


def restarted(slot: Any, dead: Any, timeout: float = READY_S) -> bool:
    """Poll (no fixed sleep) until ``slot`` has a READY worker that is not ``dead``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if slot.worker is not dead and slot.ready:
            return True
        time.sleep(0.05)
    return False


def slots(server: Any) -> list[Any]:
    [mv] = server.server.registry.all_versions()
    return mv.slots


def test_scale_up_forks_workers_that_set_their_own_threads(
    forking: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    server = forking(cores=4)
    forks = server.server.forks
    template = forks.pid
    first = report(server)  # the start-up worker: forked too (the template started first)
    assert first["ppid"] == template and first["threads"] == 4
    assert (forks.forks, forks.spawns) == (1, 0)
    scale(server, 2)
    assert forks.forks == 2
    new = [s.worker for s in slots(server) if s.worker.pid != first["pid"]]
    [worker] = new
    assert psutil.Process(worker.pid).ppid() == template
    assert isinstance(worker._proc, ForkedProc)
    seen = {r["pid"]: r for r in reports(server, 12)}
    forked = seen[worker.pid]
    # The host budget, re-shared over two workers, applied in the child (inter-op 1: its pool
    # had never started in the template); no CUDA; its own session; the server's environment.
    assert (forked["threads"], forked["interop"]) == (2, 1)
    assert forked["cuda_initialized"] is False
    assert forked["sid"] == worker.pid
    assert forked["marker"] == "from-the-server"
    assert forked["sum"] == 64 * 64 * 64
    assert seen[first["pid"]]["threads"] == 2  # the first worker was re-tuned to its share
    scale(server, 1)  # the last slot leaves: the forked worker, stopped
    assert [s.worker.pid for s in slots(server)] == [first["pid"]]
    # What it printed reached the output it inherited, though a forked worker ends with
    # os._exit (which flushes nothing by itself).
    assert f"fork-test print from {worker.pid}" in capfd.readouterr().out


def test_kill_9_restart_forks_and_reports_the_exit_code(forking: Any) -> None:
    server = forking()
    scale(server, 2)
    slot = slots(server)[-1]
    victim = slot.worker
    assert isinstance(victim._proc, ForkedProc)
    os.kill(victim.pid, signal.SIGKILL)
    assert victim._proc.wait(timeout=60) == -signal.SIGKILL  # the template reaped and told us
    pids = {r["pid"] for r in reports(server, 8)}
    assert victim.pid not in pids
    assert slot.worker is not victim and slot.worker.exit_code is None
    assert psutil.Process(slot.worker.pid).ppid() == server.server.forks.pid
    # The slot counts a restart once its new worker has loaded, which the eight answers above
    # need not wait for (the other worker can answer them all).
    until(lambda: slot.restarts > 0, "the slot counted its restart", READY_S)
    assert slot.restarts == 1


def test_recycling_forks_the_successor_and_loses_no_request(forking: Any) -> None:
    server = forking(
        models={"forked": {"1.0": {"marName": "forked.mar", "maxRequestsPerWorker": 3}}}
    )
    forks = server.server.forks
    pids: list[int] = []
    # Requests answered while a successor starts and its predecessor stops do not ask for
    # another recycle (slot.py): a few more than 2 x 3 are needed to see two recycles.
    while len(set(pids)) < 3 and len(pids) < 60:
        pids.append(report(server)["pid"])  # every one answered 200
    assert len(set(pids)) == 3, pids
    [slot] = slots(server)
    assert slot.recycles >= 2 and forks.forks >= 2
    assert psutil.Process(slot.worker.pid).ppid() == forks.pid


def test_a_dead_template_means_a_spawned_worker_and_a_new_template(forking: Any) -> None:
    server = forking()
    forks = server.server.forks
    scale(server, 2)
    slot = slots(server)[-1]
    forked = slot.worker
    assert isinstance(forked._proc, ForkedProc)
    old_template = forks._template.proc
    old_template.kill()
    old_template.wait(timeout=60)
    assert forked.pid in {r["pid"] for r in reports(server, 8)}  # its workers serve on
    spawns = forks.spawns
    scale(server, 3)  # the template is gone: spawned the old way, and a new template started
    assert forks.spawns == spawns + 1
    [spawned] = [s.worker for s in slots(server)[2:]]
    assert isinstance(spawned._proc, subprocess.Popen)
    assert forks.wait_ready(READY_S) and forks.pid not in (None, old_template.pid)
    assert forks.restarts == 1
    os.kill(forked.pid, signal.SIGKILL)  # an orphan now: its exit is seen through its pidfd
    assert forked._proc.wait(timeout=60) == -1
    assert restarted(slot, forked), "the killed worker's slot did not get a READY worker"
    assert slot.worker is not forked  # restarted: forked from the new template
    # Pull-based dispatch gives no worker a share of a burst, so send bursts until each of the
    # three workers has answered (each answer is a 200), bounded.
    pids = {s.worker.pid for s in slots(server)}
    answered: set[int] = set()
    for _ in range(20):
        answered |= {r["pid"] for r in reports(server, 12)}
        if answered >= pids:
            break
    assert answered == pids
    assert psutil.Process(slot.worker.pid).ppid() == forks.pid


def test_a_template_that_does_not_answer_stalls_nothing_and_is_replaced(
    forking: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forkserver, "FORK_REPLY_TIMEOUT_S", 5.0)
    server = forking()
    forks = server.server.forks
    silent = forks._template.proc
    os.kill(silent.pid, signal.SIGSTOP)  # alive and ready, but it never answers a fork
    try:
        url = f"{server.management_url}/models/forked"
        scaled = httpx.put(url, params={"min_worker": 2, "max_worker": 2}, timeout=60)
        assert scaled.status_code == 202, scaled.text  # the new worker starts in the background
        waits = []
        end = time.monotonic() + 6.0  # past the fork's timeout
        while time.monotonic() < end:
            start = time.monotonic()
            report(server)
            waits.append(time.monotonic() - start)
        # The frontend kept serving while the fork waited (it waited on the event loop: 5 s).
        assert max(waits) < 2.5, waits
        assert silent.wait(timeout=60) == -signal.SIGKILL  # taken for broken: never waited again
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(silent.pid, signal.SIGCONT)
    until(lambda: sum(s.ready for s in slots(server)) == 2, "the spawned worker", timeout=READY_S)
    assert forks.wait_ready(READY_S) and forks.pid not in (None, silent.pid)
    forked = forks.forks
    scale(server, 3)  # from the new template
    assert forks.forks == forked + 1


def test_worker_start_spawn_never_forks(live_server: Any, fork_store: Path) -> None:
    server = live_server(
        model_store=fork_store, load_models=["forked=forked.mar"], worker_start="spawn"
    )
    assert server.server.forks is None
    scale(server, 2)
    assert {psutil.Process(p).ppid() for p in server.worker_pids()} == {os.getpid()}


def test_an_environment_a_fork_cannot_give_is_spawned() -> None:
    forks = ForkServer(os.environ)
    forks.start()
    try:
        assert forks.wait_ready(READY_S)
        same = forks.spawn(os.environ)
        assert isinstance(same.proc, ForkedProc)
        other = forks.spawn({**os.environ, "MALLOC_ARENA_MAX": "2"})  # read at glibc's start
        assert isinstance(other.proc, subprocess.Popen)
        same.discard()  # EOF before a Load: it exits 0 at once (its imports were done)
        assert same.proc.returncode == 0
        other.discard()  # (still importing torch, it may be killed after discard's 10 s)
        assert (forks.forks, forks.spawns) == (1, 1)
    finally:
        forks.close()


def test_the_start_up_models_workers_all_fork_from_one_template(
    live_server: Any, fork_store: Path
) -> None:
    """The template starts first and every start-up worker forks from it: one import of torch
    for them all (they were spawned, each importing torch, and the template after them)."""
    loads = ["a=forked.mar", "b=forked.mar"]
    server = live_server(model_store=fork_store, load_models=loads, default_workers_per_model=2)
    forks = server.server.forks
    assert (forks.forks, forks.spawns) == (4, 0)
    assert {psutil.Process(p).ppid() for p in server.worker_pids()} == {forks.pid}


def test_a_worker_start_waits_for_a_template_still_starting() -> None:
    forks = ForkServer(os.environ)
    forks.start()
    try:
        assert not forks._template.settled.is_set()  # importing torch for a second or more
        started = forks.spawn(os.environ)
        assert isinstance(started.proc, ForkedProc)
        started.discard()
        assert (forks.forks, forks.spawns) == (1, 0)
    finally:
        forks.close()


def test_a_template_that_dies_while_starting_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(forkserver, "TEMPLATE_START_WAIT_S", 600.0)  # past the test's timeout
    forks = ForkServer(os.environ)
    forks.start()
    try:
        forks._template.proc.kill()
        started = forks.spawn(os.environ)  # at once: spawned (and a new template started)
        assert isinstance(started.proc, subprocess.Popen)
        started.discard()
        assert (forks.forks, forks.spawns, forks.restarts) == (0, 1, 1)
    finally:
        forks.close()


def _fd_target(pid: int, fd: int) -> str:
    return os.readlink(f"/proc/{pid}/fd/{fd}")


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="reads /proc/PID/fd")
def test_an_adopted_template_forks_workers_that_write_where_the_frontend_does(
    tmp_path: Path,
) -> None:
    """The CLI's early template writes to a pipe of its own (server/early_workers.py); the
    workers forked from it write to the frontend's stdout and stderr, as spawned ones do: the
    fork request carries them."""
    env = worker_env(os.environ)
    with (tmp_path / "template.out").open("wb") as own:
        proc, ctl = start_worker(sys.executable, "text", env, template=True, output=own.fileno())
    forks = ForkServer(os.environ)
    forks.adopt(proc, ctl, env)
    forks.start()  # keeps the adopted one
    try:
        assert forks.pid == proc.pid and forks.wait_ready(READY_S)
        worker = forks.spawn(os.environ)
        assert isinstance(worker.proc, ForkedProc) and forks.restarts == 0
        assert _fd_target(proc.pid, 1).endswith("template.out")
        for fd in (1, 2):  # (the fork is answered before the child has dup2'ed them)
            ours = _fd_target(os.getpid(), fd)
            until(lambda fd=fd, ours=ours: _fd_target(worker.proc.pid, fd) == ours, "dup2")
        worker.discard()
        assert worker.proc.returncode == 0
    finally:
        forks.close()


def test_an_early_template_a_fork_could_not_match_is_closed() -> None:
    """An early template started with another allocator setting than the server's workers get
    is stopped, not adopted: the server starts its own."""
    env = {**worker_env(os.environ), "MALLOC_ARENA_MAX": "2"}
    proc, ctl = start_worker(sys.executable, "text", env, template=True)
    forks = ForkServer(os.environ)
    try:
        forks.adopt(proc, ctl, env)
        assert proc.poll() is not None and forks.pid is None
    finally:
        forks.close()
