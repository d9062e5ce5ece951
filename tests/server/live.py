"""A live server in a test: :class:`LiveServer` runs a real TorchbayServer (real uvicorn on
127.0.0.1 port 0, real workers) in a thread; :func:`until` and the probes a test polls with
instead of sleeping. Re-exported by conftest.py, where tests import them from."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

from torchbay.server.config.settings import ServerConfig
from torchbay.server.serve import TorchbayServer


def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` every 10 ms until it holds; fail, naming ``what``, after ``timeout``
    seconds (a live server's state, read from outside: nothing to wait on directly)."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"not in {timeout:g} s: {what}"
        time.sleep(0.01)


def batch_running(server: Any, model: str) -> bool:
    """``model``'s first worker runs a batch and nothing waits in its queue (describe): what a
    test that kills, signals or queues behind a batch polls for instead of sleeping."""
    r = httpx.get(f"{server.management_url}/models/{model}", timeout=30)
    described = r.json()[0]
    pending = described["jobQueueStatus"]["pendingRequests"]
    return described["workers"][0]["state"] == "BUSY" and pending == 0


def ran_ids(log: Path) -> list[str]:
    """The ids of the requests tests/server/assets/gate_handler.py ran, in order (its log)."""
    return log.read_text().split() if log.exists() else []


def longest_gap(probe_url: str, action: Callable[[], Any]) -> tuple[Any, float, float]:
    """``action()``'s result, the longest wait between two answers of the GETs of ``probe_url``
    sent one after another while it ran (its start and end count as answers), and how long it
    ran (seconds). A server whose event loop a step of ``action`` holds answers no GET for that
    long. On a loaded machine the gaps and the run grow alike: compare the one with the other
    (a step that holds the loop for most of the run), never with a time measured apart."""
    answered: list[float] = []

    def timed() -> tuple[Any, float, float]:
        started = time.monotonic()
        return action(), started, time.monotonic()

    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=300) as client:
        client.get(probe_url)  # connected: the probes measured from here on
        call = pool.submit(timed)
        while not call.done():
            client.get(probe_url)
            answered.append(time.monotonic())
        result, started, finished = call.result()
    marks = [started, *(t for t in answered if started < t < finished), finished]
    longest = max(later - earlier for earlier, later in itertools.pairwise(marks))
    return result, longest, finished - started


class LiveServer:
    """A TorchbayServer running in a background thread with its own event loop."""

    def __init__(self, config: ServerConfig, *, uvloop: bool = True, **kwargs: Any) -> None:
        """``uvloop``: the server runs on uvloop, as ``torchbay serve`` runs it (cli.py); False:
        on asyncio's own loop. The two differ where a test can see it: libuv reads a socket up
        to 32 times per wake-up, asyncio once (a client that left after a large body went
        unnoticed on uvloop only: test_cancel)."""
        self.server = TorchbayServer(config, env=dict(os.environ), **kwargs)
        self._thread = threading.Thread(target=self._run, name="torchbay-test-server", daemon=True)
        self._error: BaseException | None = None
        self._uvloop = uvloop

    def _run(self) -> None:
        try:
            if self._uvloop:
                import uvloop

                uvloop.run(self.server.serve())
            else:
                asyncio.run(self.server.serve())
        except BaseException as exc:  # surfaced by start()/stop()
            self._error = exc
            self.server.state.started.set()

    def start(self) -> LiveServer:
        self._thread.start()
        assert self.server.state.started.wait(120), "server did not start"
        if self._error is not None:
            raise self._error
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.state.ports.inference}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.server.state.ports.management}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.state.ports.metrics}"

    def recorded(self) -> None:
        """Return once the server has recorded (metrics, access line) every request it answered
        so far: it does that in a callback after the answers (observe.logs.Deferred), which a
        loaded host may run after the client read them, but before it answers a later request,
        so one metrics scrape answered is the barrier."""
        assert httpx.get(f"{self.metrics_url}/metrics", timeout=60).status_code == 200

    def worker_pids(self) -> list[int]:
        registry = self.server.registry
        assert registry is not None
        return [
            slot.worker.pid
            for mv in registry.all_versions()
            for slot in mv.slots
            if slot.worker is not None and slot.worker.pid is not None
        ]

    def stop(self) -> None:
        pids = self.worker_pids()
        self.server.request_stop()
        self._thread.join(60)
        assert not self._thread.is_alive(), "server did not stop"
        for pid in pids:  # every child exited
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                assert proc.status() == psutil.STATUS_ZOMBIE, f"worker {pid} still running"
        if self._error is not None:
            raise self._error
