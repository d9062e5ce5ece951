"""``response_timeout`` for one batch of a worker (``handle.WorkerProcess.infer``): the wait for
the worker's next frame, not for the whole batch. Torch-free."""

from __future__ import annotations

import asyncio
import time
from typing import Any


class FrameWatchdog:
    """``response_timeout`` for one batch: fails ``future`` with TimeoutError once ``timeout``
    passes without a frame from the worker (each Part starts the clock again: when the timer
    fires after parts came, it waits again from the last one, so a stream that stalls fails
    ``timeout`` after its last part, never up to twice that). One timer, so the dispatcher
    awaits the Result's future itself and runs the next batch one loop turn after the Result
    arrives (``wait_for(shield(...))`` took three turns, each behind every ready callback: the
    worker sat idle that long between batches). ``worker``: its ``parts_seen`` (Part frames
    received) and ``part_at`` (``time.monotonic()`` of the last one)."""

    __slots__ = ("_future", "_handle", "_seen", "_timeout", "_worker")

    def __init__(self, worker: Any, future: asyncio.Future, timeout: float) -> None:
        self._worker, self._future, self._timeout = worker, future, timeout
        self._arm(timeout)

    def _arm(self, delay: float) -> None:
        self._seen = self._worker.parts_seen
        self._handle = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        if self._future.done():
            return
        if self._worker.parts_seen != self._seen:  # a part came: the worker is alive, streaming
            self._arm(max(0.0, self._worker.part_at + self._timeout - time.monotonic()))
        else:
            self._future.set_exception(asyncio.TimeoutError())

    def cancel(self) -> None:
        self._handle.cancel()
