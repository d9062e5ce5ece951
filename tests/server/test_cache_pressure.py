"""The response cache under load, on a real server: a request the cache holds is answered while
the model's queue is full, as Triton looks a request up before it queues it; a request it does
not hold is refused 503 as ever. ``probe``: the probe handler, one worker, batch size 1, a queue
of one, cache on (real archive, our archiver); ``{"until": path}`` holds its worker busy."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import ASSETS, LiveServer, batch_running, build_store, make_config, until

pytestmark = pytest.mark.slow

MODELS = {
    "probe": {
        "1.0": {
            "marName": "probe.mar",
            "batchSize": 1,
            "minWorkers": 1,
            "maxWorkers": 1,
            "jobQueueSize": 1,
            "responseCache": True,
        }
    }
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    store = build_store(
        tmp_path_factory, "cache-pressure", {"probe": str(ASSETS / "probe_handler.py")}
    )
    live = LiveServer(make_config(store, load_models=["all"], models=MODELS)).start()
    yield live
    live.stop()


def _pending(server: LiveServer) -> int:
    described = httpx.get(f"{server.management_url}/models/probe", timeout=30).json()[0]
    return int(described["jobQueueStatus"]["pendingRequests"])


def test_a_hit_is_answered_while_the_queue_is_full(server: LiveServer, tmp_path: Path) -> None:
    url = f"{server.url}/predictions/probe"
    hot = {"echo": "hot"}
    first = httpx.post(url, json=hot, timeout=60)
    assert first.status_code == 200, first.text
    gate = tmp_path / "gate"
    answers: list[httpx.Response] = []

    def held(body: dict[str, Any]) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: answers.append(httpx.post(url, json=body, timeout=120))
        )
        thread.start()
        return thread

    threads = [held({"until": str(gate)})]
    try:
        until(lambda: batch_running(server, "probe"), "the worker runs the held batch")
        threads.append(held({"until": str(gate), "echo": "queued"}))
        until(lambda: _pending(server) == 1, "the queue holds one request: it is full")
        cold = httpx.post(url, json={"echo": "cold"}, timeout=60)
        assert cold.status_code == 503 and "queue" in cold.text, cold.text
        # Refused a moment ago, the version is pressed: the listener's early refusal too lets
        # a request through that the cache may answer.
        for _ in range(2):
            again = httpx.post(url, json=hot, timeout=60)
            assert again.status_code == 200, again.text
            assert again.json() == first.json()  # the stored answer
    finally:
        gate.touch()
        for thread in threads:
            thread.join(120)
    assert [a.status_code for a in answers] == [200, 200]
