"""The clock of a queue's waiting requests: one timer at the earliest time a queued request must
be answered without running (its deadline: ``clientTimeoutInMills``, a level's timeout; or the
model's queue-time bound, ``max_queue_delay_ms``). A worker looks at the queue only when it is
free: with every worker busy (a long batch, a stuck one until ``response_timeout``), a request
whose deadline passed was answered only then, seconds or minutes late.

:class:`Deadlines` keeps a heap of ``(when, n, item)`` and one ``TimerHandle`` at its top: a
request costs a heap push, however many are queued. Entries of requests that left the queue
(dispatched, answered, cancelled) are dropped as they reach the top, and the heap is rebuilt
once it holds more than twice the live entries it kept at its last rebuild, so it keeps no
request's body for long after its dispatch. When the timer fires it hands each request whose
time came, still queued, to the queue (``expire``), which answers it or, when its bound moved,
watches it again.

Torch-free; it knows only the queue's ``Pending`` items and the event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from torchbay.server.errors import Overloaded, QueueTimeout, RequestTimeout, TorchbayError

clock = time.monotonic  # the queue's clock (serving/queue.py)

# Rebuilt past twice the queue plus this many entries (a queue of a few requests rebuilds rarely).
_SLACK = 16


def queued(item: Any) -> bool:
    """``item`` still waits in its queue: no worker took it and nobody answered it."""
    return item.dispatched is None and not item.future.done()


def expiry(
    p: Any, now: float, max_wait_s: float, retry_after: Callable[[], str]
) -> TorchbayError | None:
    """The answer of queued request ``p`` that must not run any more at ``now``: 504 past its
    deadline, 503 when that is its priority level's timeout (Triton's REJECT is UNAVAILABLE)
    or past the queue-time bound ``max_wait_s`` (0: none); None: it may run."""
    if p.deadline is not None and p.deadline <= now:
        if p.timeout_at is not None and p.timeout_at <= now:
            return QueueTimeout(
                "The request's timeout passed while it was queued; not run",
                oip_message="Request timeout expired",  # Triton's words
            )
        return RequestTimeout(
            "The request waited past its deadline; not run",
            oip_message="Request timeout expired",  # Triton's words
        )
    if max_wait_s > 0 and p.arrival + max_wait_s <= now:
        return Overloaded(
            f"The request waited past the model's queue-time bound of {max_wait_s * 1000:g} ms; "
            "not run",
            headers={"retry-after": retry_after()},
        )
    return None


def due(p: Any, max_wait_s: float) -> float:
    """When queued request ``p`` must be answered unrun: its deadline or the queue-time bound
    ``max_wait_s`` past its arrival (0: none), the earlier; inf: never."""
    when = math.inf if p.deadline is None else p.deadline
    return min(when, p.arrival + max_wait_s) if max_wait_s > 0 else when


def fill_by(items: Iterable[Any], max_wait_s: float) -> float:
    """When filling a batch of ``items`` must stop: half-way to the earliest of their
    deadlines and queue-time bounds (waiting longer could make one expire unrun)."""
    end = math.inf
    for p in items:
        if p.deadline is not None:
            end = min(end, p.arrival + (p.deadline - p.arrival) / 2)
        if max_wait_s > 0:
            end = min(end, p.arrival + max_wait_s / 2)
    return end


class Deadlines:
    """One timer over the times of a queue's requests (see the module docstring)."""

    def __init__(self, expire: Callable[[Any, float], None]) -> None:
        self._expire = expire  # called with (item, now) for a queued item whose time came
        self._heap: list[tuple[float, int, Any]] = []
        self._rebuild_past = _SLACK  # twice the live entries at the last rebuild, + _SLACK
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the timer fires (inf: not armed)

    def watch(self, item: Any, when: float) -> None:
        """Hand ``item`` to ``expire`` at ``when`` (``clock()`` time; inf: never) if it is
        still queued then."""
        if when == math.inf:
            return
        heap = self._heap
        heapq.heappush(heap, (when, next(self._order), item))
        if len(heap) > self._rebuild_past:
            self._rebuild()
            heap = self._heap
        top = heap[0]
        if not queued(top[2]):
            self._prune()
            if not heap:
                return
            top = heap[0]
        if top[0] < self._at:
            self._arm(top[0])

    def stop(self) -> None:
        """Forget every time and cancel the timer (the queue closed)."""
        self._heap.clear()
        self._disarm()

    def _rebuild(self) -> None:
        self._heap = [entry for entry in self._heap if queued(entry[2])]
        heapq.heapify(self._heap)
        self._rebuild_past = 2 * len(self._heap) + _SLACK

    def _prune(self) -> None:
        heap = self._heap
        while heap and not queued(heap[0][2]):
            heapq.heappop(heap)

    def _arm(self, when: float) -> None:
        self._disarm()
        self._at = when
        self._timer = asyncio.get_running_loop().call_later(max(0.0, when - clock()), self._fire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._at = math.inf

    def _fire(self) -> None:
        self._timer, self._at = None, math.inf
        now = clock()
        heap = self._heap
        due = []
        while heap and heap[0][0] <= now:
            due.append(heapq.heappop(heap)[2])
        for item in due:
            if queued(item):
                self._expire(item, now)  # may watch it again
        self._prune()
        if heap and self._timer is None:
            self._arm(heap[0][0])
