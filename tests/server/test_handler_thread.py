"""Every batch runs on the worker's main thread, the thread that ran the handler's
``initialize``, as TorchServe's backend runs them: state a handler sets there for later (torch's
grad mode, which is per thread; signal handlers, which only the main thread may install) holds
for its first request too (tests/server/assets/thread_state_handler.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import ASSETS, LiveServer, build_store, running

pytestmark = pytest.mark.slow

MODELS = {"state": {"1.0": {"marName": "state.mar"}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    handler = str(ASSETS / "thread_state_handler.py")
    store: Path = build_store(tmp_path_factory, "thread-state", {"state": handler})
    with running(store, models=MODELS) as live:
        yield live


def test_the_first_request_sees_what_initialize_set_up(server: LiveServer) -> None:
    """The first batch of each worker ran in a thread of its own (a few percent faster at
    batch 1 on CPU): there grad mode was on again (500: numpy() of a tensor that requires
    grad) and signal.signal raised ValueError; every later request passed."""
    url = f"{server.url}/predictions/state"
    for _ in range(2):
        r = httpx.post(url, json={}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json() == {"grad": False, "main_thread": True, "numpy": [2.0, 2.0]}
