"""A handler's child processes (a helper server, ffmpeg, DataLoader workers) end with their
worker: killed past the response timeout, crashed, or stopped with the server. They ran on,
reparented to init, one more set for every worker replaced (tests/server/assets/
child_handler.py starts them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from .conftest import ASSETS, LiveServer, build_store, make_config, until

MODEL = {"batchSize": 1, "maxBatchDelay": 10, "minWorkers": 1, "maxWorkers": 1}


@pytest.fixture(scope="module")
def child_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory, "children", {"child": str(ASSETS / "child_handler.py")})


@pytest.fixture(params=["fork", "spawn"])
def server(child_store: Path, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    model = {**MODEL, "responseTimeout": 2}
    models = {"child": {"1.0": {"marName": "child.mar", "defaultVersion": True, **model}}}
    config = make_config(
        child_store, models=models, worker_start=request.param, restart_backoff_s=[0.1]
    )
    live = LiveServer(config).start()
    yield live
    if live._thread.is_alive():  # (the stop test stopped it already)
        live.stop()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _child(server: LiveServer, note: Path, then: str) -> tuple[httpx.Response, int]:
    body = {"note": str(note), "then": then}
    response = httpx.post(f"{server.url}/predictions/child", json=body, timeout=60)
    child = int(note.read_text())
    return response, child


def _ends(child: int) -> None:
    try:
        until(lambda: _gone(child), f"the handler's child {child} ended", timeout=10)
    finally:
        if not _gone(child):
            psutil.Process(child).kill()


@pytest.mark.parametrize("then", ["hang", "exit"])
def test_the_children_of_a_killed_or_crashed_worker_end(
    server: LiveServer, tmp_path: Path, then: str
) -> None:
    response, child = _child(server, tmp_path / "pid", then)
    assert response.status_code == (504 if then == "hang" else 503), response.text
    _ends(child)
    after = httpx.post(f"{server.url}/predictions/child", json={}, timeout=60)
    assert after.status_code == 200, after.text


def test_the_children_of_a_stopped_worker_end(server: LiveServer, tmp_path: Path) -> None:
    response, child = _child(server, tmp_path / "pid", "answer")
    assert response.status_code == 200, response.text
    server.stop()
    _ends(child)


def test_the_children_of_a_worker_that_outlived_its_template_end(
    child_store: Path, tmp_path: Path
) -> None:
    """The template ends a forked worker's process group when it reaps the worker. With the
    template dead (killed, OOM), nobody did: a forked worker that exited then left its handler's
    children running under init. Now the frontend, which sees the exit through the pidfd, ends
    the group."""
    models = {"child": {"1.0": {"marName": "child.mar", "defaultVersion": True, **MODEL}}}
    config = make_config(child_store, models=models, worker_start="fork", restart_backoff_s=[0.1])
    live = LiveServer(config).start()
    try:
        forks = live.server.forks
        assert forks.wait_ready(120), "the worker template did not start"
        [slot] = live.server.registry.all_versions()[0].slots
        first = slot.worker
        first.kill()  # the start-up worker may predate the template: its restart is forked
        until(lambda: slot.worker is not first and slot.ready, "a forked worker", timeout=120)
        assert psutil.Process(slot.worker.pid).ppid() == forks.pid
        response, child = _child(live, tmp_path / "pid", "answer")
        assert response.status_code == 200, response.text
        template = forks._template.proc
        template.kill()
        template.wait(timeout=60)
        psutil.Process(response.json()["pid"]).kill()
        _ends(child)
    finally:
        live.stop()
