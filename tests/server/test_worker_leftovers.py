"""A worker ends, however its handler left things (tests/server/assets/leftover_handler.py):
a non-daemon thread, a multiprocessing child. Its batch is answered as soon as it died, and once
its frontend is gone it leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from .cli_helpers import all_workers, kill_tree, serve_foreground, wait_gone
from .conftest import ASSETS, LiveServer, build_store, running

pytestmark = pytest.mark.slow

MODELS = {"leftover": {"1.0": {"marName": "leftover.mar", "responseTimeout": 60}}}


@pytest.fixture(scope="module")
def leftover_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    handler = str(ASSETS / "leftover_handler.py")
    return build_store(tmp_path_factory, "leftover", {"leftover": handler})


@pytest.fixture
def server(leftover_store: Path) -> Iterator[LiveServer]:
    with running(leftover_store, models=MODELS, restart_backoff_s=[0.1]) as live:
        yield live


def test_a_worker_that_lost_its_channel_under_a_leftover_thread_is_answered_dead(
    server: LiveServer,
) -> None:
    """The start-up worker (spawned) whose socket its handler closed raised on its answer and
    waited, in the interpreter's teardown, for the handler's thread: its request was answered
    504 only at responseTimeout (60 s here, 120 by default). Now the worker exits at once."""
    url = f"{server.url}/predictions/leftover"
    first = httpx.post(url, json={"thread": True}, timeout=90)
    assert first.status_code == 200
    lost = httpx.post(url, json={"close_channel": True}, timeout=90)
    assert lost.status_code == 503, lost.text
    assert lost.json()["type"] == "WorkerDied"
    again = httpx.post(url, json={}, timeout=90)
    assert again.status_code == 200 and again.json()["pid"] != first.json()["pid"]


def test_a_worker_that_writes_junk_into_its_channel_is_answered_dead(server: LiveServer) -> None:
    """Bytes that are no frame (a handler writing to the wrong descriptor) were read as the
    length of a frame of 4 GiB: the frontend waited for it, and the request was answered 504
    at responseTimeout. Now an unknown kind (or a length past the 2 GiB bound) is a protocol
    error at once: the worker is killed, its request answered 503, a new worker serves."""
    url = f"{server.url}/predictions/leftover"
    first = httpx.post(url, json={}, timeout=90)
    junk = httpx.post(url, json={"scribble": True}, timeout=90)
    assert junk.status_code == 503, junk.text
    assert junk.json()["type"] == "WorkerDied"
    again = httpx.post(url, json={}, timeout=90)
    assert again.status_code == 200 and again.json()["pid"] != first.json()["pid"]


def test_a_worker_whose_frontend_died_ends_with_the_children_its_handler_left(
    leftover_store: Path, cli_run: tuple[Path, dict[str, str]]
) -> None:
    """The frontend SIGKILLed (the OOM killer, kill -9): its workers see EOF and exit, and the
    frontend, which ended a worker's process group after it, is not there. A worker whose handler
    left a non-daemon multiprocessing child hung for good in multiprocessing's exit hook (which
    joins it), and kept its model's memory; both ran on under init."""
    cwd, env = cli_run
    args = ["--model-store", str(leftover_store), "--models", "leftover=leftover.mar"]
    args.append("--disable-token-auth")
    proc, ready = serve_foreground(args, cwd, env)
    note = cwd / "child.pid"
    pids: list[int] = []  # the worker and its handler's child, killed whatever happens
    try:
        url = f"http://127.0.0.1:{ready['inference']}/predictions/leftover"
        assert httpx.post(url, json={"mp_child": str(note)}, timeout=90).status_code == 200
        [worker] = [p.pid for p in all_workers(proc.pid)]
        child = int(note.read_text())
        pids += [worker, child]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        assert wait_gone(worker, 60), "the worker outlived its frontend"
        assert wait_gone(child, 30), "the handler's child outlived its worker"
    finally:
        kill_tree(proc.pid)  # (what a failed check left)
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
