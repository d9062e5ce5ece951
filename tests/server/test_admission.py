"""Admission control (serving/admission.py) and the queue's dispatch-time expiry, in process:
a real BatchQueue, requests whose arrival time is set in the past instead of waiting."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import pytest

from torchbay.server.errors import Overloaded, QueueFull
from torchbay.server.grpc.status import from_error
from torchbay.server.serving import admission as admission_module
from torchbay.server.serving.admission import PRESSURE_S, Admission, any_pressed, retry_after
from torchbay.server.serving.queue import BatchQueue, Pending, clock


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """An async test run on a fresh event loop (the queue needs one)."""

    @functools.wraps(test)
    def sync() -> None:
        asyncio.run(test())

    return sync


def _queue(capacity: int = 1000, batch_size: int = 1, delay_s: float = 0.0) -> BatchQueue:
    return BatchQueue(batch_size=batch_size, max_delay_s=delay_s, capacity=capacity)


def _fill(queue: BatchQueue, n: int, *, age_s: float = 0.0) -> list[Pending]:
    loop = asyncio.get_running_loop()
    items = [Pending(i, loop.create_future(), clock() - age_s) for i in range(n)]
    for item in items:
        queue.put(item)
    return items


@pytest.mark.parametrize(
    ("seconds", "header"), [(0.0, "1"), (0.01, "1"), (1.0, "1"), (2.2, "3"), (float("inf"), "1")]
)
def test_retry_after_is_whole_seconds_at_least_one(seconds: float, header: str) -> None:
    assert retry_after(seconds) == header


@run
async def test_cold_start_admits_by_queue_length_only() -> None:
    queue = _queue()
    admission = Admission(queue, 1.0)  # a 1 ms bound, nothing measured yet
    _fill(queue, 500)
    admission.check(workers=1, busy=1, batch_size=1)  # no estimate: no refusal on a guess
    assert admission.rate is None and admission.predicted == 0


@run
async def test_refuses_when_the_predicted_wait_exceeds_the_bound() -> None:
    queue = _queue()
    admission = Admission(queue, 200.0)
    admission.learn(4, 0.04)  # 4 requests in 40 ms: 100 per second per worker
    assert admission.rate == pytest.approx(100.0)
    _fill(queue, 30)
    with pytest.raises(Overloaded) as refused:
        admission.check(workers=1, busy=1, batch_size=1)  # 30.5 batches of 10 ms: 305 ms
    assert refused.value.status == 503
    assert refused.value.headers["retry-after"] == "1"
    assert admission.rejections["predicted_wait"] == 1
    admission.check(workers=2, busy=2, batch_size=1)  # two workers: 152.5 ms, admitted
    _fill(queue, 300)  # 330.5 batches on one worker: 3.3 s to drain
    with pytest.raises(Overloaded) as refused:
        admission.check(workers=1, busy=1, batch_size=1)
    assert refused.value.headers["retry-after"] == "4"


@run
async def test_the_wait_counts_whole_batches_and_idle_workers() -> None:
    queue = _queue(batch_size=8)
    admission = Admission(queue, 200.0)
    admission.learn(8, 0.08)  # a full batch of 8 takes 80 ms
    _fill(queue, 7)
    admission.check(workers=1, busy=1, batch_size=8)  # rides in the next batch
    assert admission.predicted_wait_s() == pytest.approx(0.04)  # half of the running one
    admission.check(workers=2, busy=1, batch_size=8)  # an idle worker takes it at once
    assert admission.predicted_wait_s() == 0.0
    _fill(queue, 17)  # 24 queued: three whole batches ahead, 280 ms on one worker
    with pytest.raises(Overloaded):
        admission.check(workers=1, busy=1, batch_size=8)
    admission.check(workers=2, busy=2, batch_size=8)  # two workers: 140 ms
    assert admission.predicted_wait_s() == pytest.approx(0.14)


@run
async def test_small_batches_fixed_cost_is_not_multiplied() -> None:
    admission = Admission(_queue(), 200.0)
    for _ in range(5):
        admission.learn(1, 0.030)  # 28 ms of fixed cost + 2 ms per request
        admission.learn(4, 0.036)
    assert admission.batch_time_s(8) == pytest.approx(0.044)  # not 8 x 30 ms
    only = Admission(_queue(), 200.0)
    only.learn(2, 0.02)  # one size seen: proportional
    assert only.batch_time_s(8) == pytest.approx(0.08)
    assert Admission(_queue(), 200.0).batch_time_s(8) is None


@run
async def test_bound_zero_is_off_and_configure_none_keeps_it() -> None:
    queue = _queue()
    admission = Admission(queue, 0.0)
    admission.learn(1, 1.0)  # one request per second
    _fill(queue, 100)
    admission.check(workers=1, busy=1, batch_size=1)  # 101 s predicted, but the bound is off
    assert queue.max_wait_s == 0.0
    admission.configure(50.0)
    assert queue.max_wait_s == pytest.approx(0.05)
    admission.configure(None)
    assert admission.bound_s == pytest.approx(0.05)
    with pytest.raises(Overloaded):
        admission.check(workers=1, busy=1, batch_size=1)
    assert admission.describe()["maxQueueDelayMs"] == pytest.approx(50.0)


@run
async def test_the_estimate_follows_the_recent_batches() -> None:
    admission = Admission(_queue(), 100.0, decay=0.5)
    admission.learn(1, 0.1)  # 10 per second
    for _ in range(20):
        admission.learn(8, 0.08)  # then 100 per second
    assert admission.rate == pytest.approx(100.0, rel=0.01)
    admission.learn(0, 1.0)  # nothing served: ignored
    admission.learn(3, 0.0)  # no time measured: ignored
    assert admission.rate == pytest.approx(100.0, rel=0.01)


@run
async def test_a_request_queued_past_the_bound_is_answered_503_and_never_runs() -> None:
    queue = _queue(batch_size=4)
    admission = Admission(queue, 200.0)
    admission.learn(1, 0.5)  # 2 per second: the Retry-After comes from the drain time
    stale = _fill(queue, 2, age_s=5.0)
    fresh = _fill(queue, 1)
    batch = await asyncio.wait_for(queue.take(), 10)
    assert batch == fresh
    for item in stale:
        exc = item.future.exception()
        assert isinstance(exc, Overloaded)
        assert int(exc.headers["retry-after"]) >= 1
    assert admission.rejections["expired"] == 2


@run
async def test_a_batch_never_waits_to_fill_past_the_bound() -> None:
    queue = _queue(batch_size=8, delay_s=60.0)  # a batch window far longer than the bound
    Admission(queue, 50.0)
    items = _fill(queue, 1)
    batch = await asyncio.wait_for(queue.take(), 30)  # without the cap: 60 s
    assert batch == items
    assert not items[0].future.done()  # dispatched, not expired


@run
async def test_a_full_queue_says_when_to_retry() -> None:
    queue = _queue(capacity=3)
    admission = Admission(queue, 0.0)
    admission.learn(1, 2.0)  # half a request per second: 3 queued drain in 6 s
    _fill(queue, 3)
    with pytest.raises(QueueFull) as full:
        _fill(queue, 1)
    assert full.value.headers["retry-after"] == "6"
    assert admission.rejections == {"predicted_wait": 0, "expired": 0, "queue_full": 1}


def test_grpc_unavailable_carries_retry_after() -> None:
    error = from_error(Overloaded("busy", headers={"retry-after": "2"}))
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert error.metadata == (("retry-after", "2"),)
    assert from_error(QueueFull("full")).metadata == ()


def test_a_refusal_presses_its_model_version_for_a_while() -> None:
    """``pressed`` (the listeners' cue to refuse from the headers) lasts PRESSURE_S after the
    last refusal of that model version; ``any_pressed`` is the process-wide early exit."""
    calm, busy = Admission(_queue(), 200), Admission(_queue(), 200)
    assert not calm.pressed and not busy.pressed
    busy.refused()
    assert busy.pressed and not calm.pressed and any_pressed()
    busy.refused_at = clock() - PRESSURE_S - 0.01
    assert not busy.pressed
    admission_module._last_refusal[0] = clock() - PRESSURE_S - 0.01
    assert not any_pressed()  # (no live server in this module refuses meanwhile)
