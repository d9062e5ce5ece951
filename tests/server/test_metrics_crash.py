"""A handler's metrics recorded in a batch its worker dies in (``os._exit``, a segfault, a kill
after ``responseTimeout``) are published, as TorchServe 0.12 publishes them: its backend writes
each record to the worker's stdout as it is made (``PreCrash.u:1.0|#...`` reached its
model_metrics.log from a handler that then called ``os._exit``). torchbay's ride back with the
batch's results, and the worker's metrics spill (server/serving/spill.py) keeps them when no
results come. Counted once: a batch that completes clears the spill."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from torchbay.handlers.metrics import MetricsCache
from torchbay.server.serving import spill
from torchbay.server.serving.spill import SpillWriter

from .conftest import LiveServer, make_config, tiny_archive, until

HANDLER = """
import os
import time

from ts.torch_handler.base_handler import BaseHandler


class CrashHandler(BaseHandler):
    def handle(self, data, context):
        body = data[0].get("body") or data[0].get("data")
        what = body.decode() if isinstance(body, (bytes, bytearray)) else str(body)
        context.metrics.add_counter("BeforeDeath", 1, None, [])
        context.metrics.add_metric("LastWords", 7, "u", None, [], "gauge")
        if what == "crash":
            os._exit(3)
        if what == "hang":
            time.sleep(120)
        return [{"ok": what}]
"""
BATCH_HANDLER = """
from ts.torch_handler.base_handler import BaseHandler


class BatchHandler(BaseHandler):
    def handle(self, data, context):
        context.metrics.add_counter("Seen", len(data))
        bodies = [(row.get("body") or row.get("data")) for row in data]
        bodies = [b.decode() if isinstance(b, (bytes, bytearray)) else str(b) for b in bodies]
        if "bad" in bodies:
            raise ValueError("a bad input")
        return [{"batch": len(data)} for _ in data]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("metrics-crash")
    (work / "crash_handler.py").write_text(HANDLER)
    store = work / "store"
    store.mkdir()
    tiny_archive(work, store, "crash", str(work / "crash_handler.py"))
    (work / "batch_handler.py").write_text(BATCH_HANDLER)
    tiny_archive(work, store, "batched", str(work / "batch_handler.py"))
    settings = {"marName": "crash.mar", "batchSize": 1, "responseTimeout": 5}
    batched = {"marName": "batched.mar", "batchSize": 4, "maxBatchDelay": 20000}
    config = make_config(
        store,
        models={"crash": {"1.0": settings}, "batched": {"1.0": batched}},
        disable_system_metrics=True,
        restart_backoff_s=(0.0, 0.1, 0.2),
    )
    live = LiveServer(config).start()
    yield live
    live.stop()


def _value(server: LiveServer, name: str, model: str = "crash") -> float | None:
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def _ask(server: LiveServer, what: str) -> httpx.Response:
    return httpx.post(f"{server.url}/predictions/crash", content=what.encode(), timeout=120)


@pytest.mark.parametrize(("death", "status"), [("crash", 503), ("hang", 504)])
def test_what_a_handler_recorded_before_its_worker_died_is_published(
    server: LiveServer, death: str, status: int
) -> None:
    before = _value(server, "BeforeDeath_total") or 0.0
    assert _ask(server, death).status_code == status
    # Recorded once the dispatcher has seen the batch fail (just after its answer): polled.
    until(lambda: _value(server, "BeforeDeath_total") == before + 1, "the dead batch's metric")
    assert _value(server, "LastWords") == 7.0
    # The next batch, on a new worker, adds its own record, and the one lost is not counted
    # twice (a batch that completes clears the spill).
    answer = _ask(server, "fine")
    assert answer.status_code == 200, answer.text
    until(lambda: _value(server, "BeforeDeath_total") == before + 2, "the next batch's metric")
    assert _value(server, "BeforeDeath_total") == before + 2


def test_the_spill_is_unlinked_once_mapped_and_cleared_with_each_batch() -> None:
    writer = SpillWriter()
    reader = spill.reader(writer.path)
    assert reader is not None and not Path(writer.path).exists()  # both mappings stay
    writer.add({"name": "a", "value": 1.0})
    writer.clear()  # the batch's records rode back with its results
    writer.add({"name": "b", "value": 2.0, "dimensions": {"k": '\u00e9\n"'}})
    assert reader.take() == [{"name": "b", "value": 2.0, "dimensions": {"k": '\u00e9\n"'}}]
    assert reader.take() == []  # once
    assert spill.reader("/etc/passwd") is None  # not a spill: never mapped nor unlinked


def test_a_batch_run_again_in_halves_records_each_request_once(server: LiveServer) -> None:
    """A batch of four whose handler raises (one bad input) is run again in halves until the
    bad one is alone: the handler's ``Seen`` counter (``len(data)`` per call) counted 4 + 2 + 1
    + 1 + 2; each request is counted once now (TorchServe, which fails the whole batch, 4)."""

    async def four() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            url = f"{server.url}/predictions/batched"
            bodies = ("a", "b", "c", "bad")
            return list(await asyncio.gather(*(client.post(url, content=b) for b in bodies)))

    answers = asyncio.run(four())
    assert [a.status_code for a in answers] == [200, 200, 200, 500], [a.text for a in answers]
    # The good ones were answered by the halves of one batch of four (none ran alone first).
    assert sorted(a.json()["batch"] for a in answers[:3]) == [1, 2, 2]
    until(lambda: _value(server, "Seen_total", "batched") is not None, "the batch's metric")
    assert _value(server, "Seen_total", "batched") == 4.0


def test_a_rewound_run_leaves_the_spill_with_the_records_kept() -> None:
    metrics = MetricsCache("m")
    metrics.spill = SpillWriter()
    reader = spill.reader(metrics.spill.path)
    assert reader is not None
    metrics.add_counter("Kept", 1)
    mark = metrics.mark()
    metrics.add_counter("Retried", 2)  # a run that raised: its halves run again
    metrics.rewind(mark)
    assert [r["name"] for r in reader.take()] == ["Kept"]
    assert [r["name"] for r in metrics.drain()] == ["Kept"]
