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
