"""A worker slot whose batch run raises what it never should (a bug of ours, e.g. a request the
IPC layer cannot encode): the batch is answered 500, the worker is replaced, and the slot serves
on. Before, the dispatcher task ended on the exception: the batch was never answered and the
slot never took another request (every later request to a one-worker model hung).

The worker process is the I/O seam: a fake worker raises from ``infer`` once; the slot, its
queue and its supervisor are the real ones."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from torchbay.server.errors import HandlerFailed
from torchbay.server.serving import protocol as p
from torchbay.server.serving.launch import ModelSettings, Placement
from torchbay.server.serving.queue import BatchQueue, Pending, clock
from torchbay.server.serving.slot import BatchRecord, SlotContext, SlotEvents, WorkerSlot

_pids = itertools.count(1000)


class FakeWorker:
    """A worker process as the slot drives it; ``broken`` makes its first ``infer`` raise."""

    def __init__(self, broken: bool) -> None:
        self.broken, self.killed = broken, False
        self.pid, self.name = next(_pids), "W-fake"
        self.requests, self.rss_checked_at = 0, 0.0
        self.batches = 0  # batches run (a worker that ran one proved it loads and serves)
        self.own_threads: int | None = None  # the handler's own torch threads (none here)
        self.exited: asyncio.Future[int] | None = None
        self.spill = None  # no metrics spill (serving/spill.py): nothing read when it dies

    @property
    def alive(self) -> bool:
        return self.exited is not None and not self.exited.done()

    async def start(self, timeout: float, spawned: Any = None) -> None:
        self.exited = asyncio.get_running_loop().create_future()

    async def infer(self, requests: list[p.WireRequest], timeout: Any, on_part: Any) -> Any:
        if self.broken:
            raise UnicodeEncodeError("latin-1", "\u65e5", 0, 1, "ordinal not in range(256)")
        self.requests += len(requests)
        self.batches += 1
        responses = [p.WireResponse(200, f'{{"pid": {self.pid}}}'.encode()) for _ in requests]
        return SimpleNamespace(responses=responses, timings={}, metrics=[])

    def kill(self) -> None:
        self.killed = True
        if self.exited is not None and not self.exited.done():
            self.exited.set_result(-9)

    async def stop(self, timeout: float = 5.0, *, busy: bool = False) -> None:
        self.kill()


class FailingEvents(SlotEvents):
    """A model's metrics or autopilot that raises on every finished batch (a bug of ours)."""

    def __init__(self) -> None:
        self.calls = 0

    def batch_done(self, record: BatchRecord) -> None:
        self.calls += 1
        raise KeyError("hold")


async def _scenario(
    events: SlotEvents | None = None, broken_first: bool = True
) -> tuple[list[Any], list[FakeWorker]]:
    queue: BatchQueue = BatchQueue(batch_size=1, max_delay_s=0.0, capacity=10)
    settings = ModelSettings(restart_backoff_s=(0.0,))
    workers: list[FakeWorker] = []

    def new_worker(placement: Placement) -> FakeWorker:
        workers.append(FakeWorker(broken=broken_first and not workers))
        return workers[-1]

    events = events or SlotEvents()
    ctx = SlotContext("m/1.0", queue, lambda: settings, new_worker, events=events)  # type: ignore[arg-type]
    slot = WorkerSlot(ctx, 0, Placement(None, 1))
    await slot.start()
    answers: list[Any] = []
    try:
        for i in range(2):
            loop = asyncio.get_running_loop()
            item: Pending = Pending(p.WireRequest(f"r{i}", b""), loop.create_future(), clock())
            queue.put(item)
            try:
                answers.append(await asyncio.wait_for(item.future, 30))
            except HandlerFailed as exc:
                answers.append(exc)
    finally:
        await slot.retire()
    return answers, workers


def test_a_batch_run_that_raises_is_answered_and_the_slot_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers, workers = asyncio.run(_scenario())
    first, second = answers
    assert isinstance(first, HandlerFailed) and first.status == 500
    assert first.message == "Internal server error"  # no Python detail for the client
    assert workers[0].killed  # its channel may hold half a frame: replaced
    assert isinstance(second, p.WireResponse) and second.status == 200
    assert second.body == f'{{"pid": {workers[1].pid}}}'.encode()
    assert "running a batch on W-fake failed" in caplog.text  # logged as a bug of ours


def test_a_report_of_a_finished_batch_that_raises_leaves_the_slot_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The batch was answered before its report: the report's bug is logged, and the next
    request is served (the dispatcher ended on it before: every later request hung)."""
    events = FailingEvents()
    answers, workers = asyncio.run(_scenario(events, broken_first=False))
    assert [a.status for a in answers] == [200, 200] and events.calls == 2
    assert len(workers) == 1  # the worker did nothing wrong: not replaced
    assert "recording a finished batch failed" in caplog.text
