"""The batching queue on its own: admission, batch formation, deadlines, adaptive waiting.

Timed checks tell a window that was waited from one that was not by half the window or more,
the windows long enough (seconds) that a stall of a loaded host cannot blur the two; a batch that
leaves when full costs none of its window."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from torchbay.server.errors import (
    Overloaded,
    QueueFull,
    RequestTimeout,
    ShuttingDown,
    TorchbayError,
)
from torchbay.server.serving.queue import BatchQueue, Pending, clock


def _item(
    loop: asyncio.AbstractEventLoop, payload: object, deadline: float | None = None
) -> Pending:
    return Pending(payload, loop.create_future(), clock(), deadline)


def run(coro):
    return asyncio.run(coro)


def test_full_batch_leaves_at_once_in_arrival_order():
    async def scenario() -> list[object]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=3, max_delay_s=60, capacity=10)
        for i in range(5):
            q.put(_item(loop, i))
        batch = await asyncio.wait_for(q.take(), 5)  # would hang 60 s if it waited
        return [p.payload for p in batch]

    assert run(scenario()) == [0, 1, 2]


def test_partial_batch_waits_for_more_until_full():
    async def scenario() -> list[object]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=3, max_delay_s=60, capacity=10)
        q.put(_item(loop, "a"))
        taker = asyncio.ensure_future(q.take())
        await asyncio.sleep(0.05)
        assert not taker.done()  # first batch probes: it waits for company
        q.put(_item(loop, "b"))
        q.put(_item(loop, "c"))
        batch = await asyncio.wait_for(taker, 5)
        return [p.payload for p in batch]

    assert run(scenario()) == ["a", "b", "c"]


def test_delay_counts_from_the_oldest_request():
    async def scenario() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=8, max_delay_s=20, capacity=10)
        first = _item(loop, 0)
        first.arrival -= 19.9  # it has already waited 19.9 s of its 20 s
        q.put(first)
        started = clock()
        batch = await asyncio.wait_for(q.take(), 60)
        return len(batch), clock() - started

    size, waited = run(scenario())
    assert size == 1
    assert waited < 10  # only the remaining ~0.1 s, not a fresh 20 s window


def test_no_waiting_when_nothing_arrives_while_waiting():
    """A closed-loop single client: after one useless wait the queue stops waiting."""

    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(
            batch_size=8, max_delay_s=2.0, capacity=10, probe_interval_s=3600
        )
        waits = []
        for i in range(4):
            q.put(_item(loop, i))
            started = clock()
            await asyncio.wait_for(q.take(), 60)
            waits.append(clock() - started)
        return waits

    waits = run(scenario())
    assert waits[0] >= 1.9  # the first batch probed the full window and gained nothing
    assert all(w < 1.0 for w in waits[1:])  # then it dispatched at once


def test_waits_again_when_requests_do_arrive_while_waiting():
    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=4, max_delay_s=30, capacity=10, probe_interval_s=3600)
        sizes = []
        for _ in range(3):
            q.put(_item(loop, "x"))
            taker = asyncio.ensure_future(q.take())
            for _ in range(3):
                await asyncio.sleep(0.02)
                q.put(_item(loop, "y"))
            sizes.append(len(await asyncio.wait_for(taker, 60)))
        return sizes

    assert run(scenario()) == [4, 4, 4]


class _WakeCountingQueue(BatchQueue):
    """Counts the times a waiting ``take`` is woken."""

    wakes = 0

    def _wake(self) -> None:
        if self._waker is not None and not self._waker.done():
            self.wakes += 1
        super()._wake()


def test_a_filling_batch_is_woken_once_when_full_not_per_arrival():
    """Each wake costs the event loop a future and a timer; a batch leaves no sooner for being
    woken by arrivals that do not fill it."""

    async def scenario() -> tuple[int, int, float]:
        loop = asyncio.get_running_loop()
        q = _WakeCountingQueue(batch_size=4, max_delay_s=30, capacity=10, probe_interval_s=3600)
        q.put(_item(loop, "x"))
        taker = asyncio.ensure_future(q.take())
        for _ in range(3):
            await asyncio.sleep(0.02)
            q.put(_item(loop, "y"))
        filled = clock()
        batch = await asyncio.wait_for(taker, 60)
        return len(batch), q.wakes, clock() - filled

    size, wakes, after_full = run(scenario())
    assert size == 4
    assert wakes == 1  # the fourth request; the second and third did not wake it
    assert after_full < 15  # it left when full, not at the end of its 30 s window


def test_queue_full_rejects_at_once_with_retry_after():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=1, max_delay_s=0, capacity=2)
        q.put(_item(loop, 1))
        q.put(_item(loop, 2))
        with pytest.raises(QueueFull) as info:
            q.put(_item(loop, 3))
        assert info.value.status == 503 and info.value.headers["retry-after"] == "1"
        assert len(q) == 2

    run(scenario())


def test_expired_requests_are_answered_and_never_dispatched():
    async def scenario() -> tuple[list[object], BaseException | None]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=4, max_delay_s=0, capacity=10)
        expired = _item(loop, "late", deadline=clock() - 1)
        q.put(expired)
        q.put(_item(loop, "ok"))
        batch = await q.take()
        return [p.payload for p in batch], expired.future.exception()

    payloads, exc = run(scenario())
    assert payloads == ["ok"]
    assert isinstance(exc, RequestTimeout) and exc.status == 504


def test_callers_who_left_are_dropped_before_dispatch():
    async def scenario() -> list[object]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=4, max_delay_s=0, capacity=10)
        gone = _item(loop, "gone")
        q.put(gone)
        q.put(_item(loop, "here"))
        gone.future.cancel()
        return [p.payload for p in await q.take()]

    assert run(scenario()) == ["here"]


def test_cancelled_take_loses_nothing_and_requeue_keeps_order():
    async def scenario() -> list[object]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=3, max_delay_s=60, capacity=10)
        q.put(_item(loop, "a"))
        taker = asyncio.ensure_future(q.take())
        await asyncio.sleep(0.02)
        taker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taker
        assert len(q) == 1
        q.put(_item(loop, "b"))
        q.put(_item(loop, "c"))
        batch = await q.take()
        q.requeue_front(batch)
        return [p.payload for p in await q.take()]

    assert run(scenario()) == ["a", "b", "c"]


def test_close_refuses_new_and_returns_queued():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=1, max_delay_s=0, capacity=5)
        q.put(_item(loop, 1))
        drained = q.close(ShuttingDown("bye"))
        assert [p.payload for p in drained] == [1]
        with pytest.raises(ShuttingDown):
            q.put(_item(loop, 2))

    run(scenario())


def test_live_reconfigure_changes_batch_size():
    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=8, max_delay_s=60, capacity=10)
        q.put(_item(loop, 1))
        q.put(_item(loop, 2))
        taker = asyncio.ensure_future(q.take())
        await asyncio.sleep(0.02)
        q.configure(batch_size=2)  # now the two queued requests are a full batch
        return len(await asyncio.wait_for(taker, 5))

    assert run(scenario()) == 2


def test_a_batch_never_waits_to_fill_past_a_requests_deadline():
    """A 60 s batch window and a request with 1 s to live: the batch leaves with it in time
    (half-way to its deadline), not at the window's end, where it was answered 504 unrun."""

    async def scenario() -> tuple[list[object], bool]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=8, max_delay_s=60, capacity=10)
        item = _item(loop, "soon", deadline=clock() + 1.0)
        q.put(item)
        batch = await asyncio.wait_for(q.take(), 30)
        return [p.payload for p in batch], item.future.done()

    assert run(scenario()) == (["soon"], False)


@pytest.mark.parametrize("bound", ["deadline", "max_wait_s"])
def test_a_queued_request_is_answered_at_its_bound_while_no_worker_takes(bound):
    """Every worker busy (no ``take``): a request whose deadline (or queue-time bound) passes
    is answered then (504 / 503), not when a worker next takes; it never runs."""

    async def scenario() -> tuple[BaseException | None, list[object]]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=4, max_delay_s=0, capacity=10)
        if bound == "max_wait_s":
            q.max_wait_s = 0.05
        late = _item(loop, "late", deadline=clock() + 0.05 if bound == "deadline" else None)
        q.put(late)
        with pytest.raises(TorchbayError) as info:
            await asyncio.wait_for(late.future, 30)
        q.put(_item(loop, "next"))
        return info.value, [p.payload for p in await q.take()]

    error, batch = run(scenario())
    assert batch == ["next"]
    if bound == "deadline":
        assert isinstance(error, RequestTimeout) and error.status == 504
    else:
        assert isinstance(error, Overloaded) and error.status == 503


def test_thousands_of_deadlines_are_each_answered_once():
    """5000 queued requests, deadlines spread over 50 ms, no worker: each is answered 504
    once, and a taker after them gets only the live one."""

    async def scenario() -> tuple[int, list[object]]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=8, max_delay_s=0, capacity=6000)
        now = clock()
        doomed = [_item(loop, i, deadline=now + (i % 50) / 1000) for i in range(5000)]
        for item in doomed:
            q.put(item)
        await asyncio.wait_for(
            asyncio.gather(*(i.future for i in doomed), return_exceptions=True), 30
        )
        q.put(_item(loop, "live"))
        timeouts = sum(isinstance(i.future.exception(), RequestTimeout) for i in doomed)
        return timeouts, [p.payload for p in await q.take()]

    assert run(scenario()) == (5000, ["live"])


@pytest.mark.parametrize("given", ["at_put", "after_put"])
def test_a_newcomer_with_a_deadline_ends_a_filling_batch_in_time(given):
    """A batch waits (60 s window) for company; a request with 1 s to live joins it, its
    deadline given at ``put`` (clientTimeoutInMills, a level's) or after it (the plane's
    ``watch``: a gRPC call's). The batch leaves with both in time, not at the window's end."""

    async def scenario() -> tuple[list[object], bool]:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=8, max_delay_s=60, capacity=10)
        q.put(_item(loop, "first"))
        taker = asyncio.ensure_future(q.take())
        await asyncio.sleep(0.05)
        assert not taker.done()  # the first batch probes: it waits for company
        soon = _item(loop, "soon", deadline=clock() + 1.0 if given == "at_put" else None)
        q.put(soon)
        if given == "after_put":
            soon.deadline = clock() + 1.0
            q.watch(soon)
        batch = await asyncio.wait_for(taker, 30)
        return [p.payload for p in batch], soon.future.done()

    assert run(scenario()) == (["first", "soon"], False)


def test_the_deadline_timer_keeps_no_dispatched_request():
    """100 requests with deadlines an hour away run; newcomers with earlier deadlines follow.
    The timer's heap lets the dispatched ones go (their bodies are freed), though they never
    reached its top."""

    class Body:
        pass

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(batch_size=100, max_delay_s=0, capacity=1000)
        bodies = [Body() for _ in range(100)]
        refs = [weakref.ref(body) for body in bodies]
        for body in bodies:
            q.put(_item(loop, body, deadline=clock() + 3600))
        del bodies, body
        for done in await q.take():
            done.future.set_result(None)
        del done
        for i in range(200):
            q.put(_item(loop, i, deadline=clock() + 1800))
        gc.collect()
        return sum(ref() is not None for ref in refs)

    assert run(scenario()) == 0
