"""``response_timeout`` per batch (serving/watchdog.py's ``FrameWatchdog``): a batch fails with
TimeoutError only after ``timeout`` without a frame from its worker; each Part restarts it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from torchbay.server.serving.queue import clock
from torchbay.server.serving.watchdog import FrameWatchdog


def test_parts_restart_the_clock_and_silence_fails_the_batch() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        worker = SimpleNamespace(parts_seen=0, part_at=0.0)
        future = loop.create_future()
        started = clock()
        FrameWatchdog(worker, future, 0.1)  # type: ignore[arg-type]
        for _ in range(3):  # a part every 70 ms: 210 ms in all, past two whole timeouts
            await asyncio.sleep(0.07)
            assert not future.done()
            worker.parts_seen += 1
            worker.part_at = clock()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(future, 5)
        return clock() - started

    assert run(scenario()) >= 0.3  # a whole timeout of silence after the last part (at 0.21 s)


def test_a_result_in_time_is_kept_and_the_timer_cancelled() -> None:
    async def scenario() -> object:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        watchdog = FrameWatchdog(SimpleNamespace(parts_seen=0, part_at=0.0), future, 0.05)  # type: ignore[arg-type]
        future.set_result("result")
        watchdog.cancel()
        await asyncio.sleep(0.1)  # past the timeout: nothing fires
        return future.result()

    assert run(scenario()) == "result"


def test_a_stream_that_stalls_fails_one_timeout_after_its_last_part() -> None:
    """A part just after the batch began, then silence: the batch fails ``timeout`` (2 s)
    after that part. The timer that fired at 2 s saw the part and waited a whole timeout
    again, failing it at 4 s (twice the timeout); a second of slack either side."""

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        worker = SimpleNamespace(parts_seen=0, part_at=0.0)
        future = loop.create_future()
        FrameWatchdog(worker, future, 2.0)  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        worker.parts_seen, worker.part_at = 1, clock()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(future, 30)
        return clock() - worker.part_at

    assert 1.9 <= run(scenario()) < 3.0


def run(coro):
    return asyncio.run(coro)
