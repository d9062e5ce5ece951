"""Pull-based dynamic batching: one bounded queue per model version, pulled by free workers.

Contract:

* ``put`` admits a request or raises :class:`QueueFull` at once; it never waits.
* ``take`` is called by a dispatcher whose worker is free. It returns up to ``batch_size`` requests,
  in arrival order. A full batch leaves at once. Otherwise the batch may wait for more requests,
  but never past ``max_delay`` after the OLDEST queued request arrived, nor past half-way to a
  waiting request's deadline or queue-time bound, and only while waiting can plausibly fill it:
  the queue measures how many requests arrive while it waits (closed-loop clients send nothing
  while their request is queued), and waits only when that rate predicts one more request
  before the window ends. Every ``probe_interval`` seconds it waits once anyway.
* A request whose caller left is taken out at once (``discard``: its reader's ``finish``); any
  other whose future is done is dropped before dispatch. A request still queued at its deadline
  is answered :class:`RequestTimeout` (504; :class:`QueueTimeout`, 503, when it is its priority
  level's timeout, serving/priority.py), and one queued ``max_wait_s`` (the model's
  ``max_queue_delay_ms``, 0: off; see admission.py) :class:`Overloaded` (503), then, even while
  every worker is busy (serving/deadlines.py's timer), and never runs.
* ``take`` pops requests only at its very end, synchronously, so cancelling a waiting ``take``
  loses nothing; ``_pop`` is the one place requests leave the queue for a worker.
* With priority levels or a queue policy (serving/priority.py: ``levels``), the deque is kept in
  order of place (level 1 first; one past its timeout under ``DELAY`` behind its level's live
  ones); each level's ``maxQueueSize`` is a 503 QueueFull. Without (``levels`` None) it appends.

A streaming caller (``ModelVersion.stream``) gives its ``Pending`` a ``Parts`` buffer
(serving/parts.py). The request's future answers the caller's first await: the first part
resolves it and is replaced by a fresh future for the final response, the later parts go to the
buffer (serving/streams.py); a request that streams nothing has its future resolved once.

Torch-free, and free of our worker and HTTP code: it only knows futures.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from torchbay.server.errors import Overloaded, QueueFull, QueueTimeout, TorchbayError
from torchbay.server.serving.deadlines import Deadlines, due, expiry, fill_by
from torchbay.server.serving.parts import Parts
from torchbay.server.serving.priority import Levels, settle

T = TypeVar("T")
R = TypeVar("R")

# The queue's clock. Not loop.time(): uvloop's advances in whole milliseconds, too coarse for
# queue times and millisecond batch windows. Timers are scheduled relative (call_later).
clock = time.monotonic


@dataclass(slots=True, eq=False)
class Pending(Generic[T, R]):
    """One admitted request: its payload, the future its caller awaits, and its clock."""

    payload: T
    future: asyncio.Future[R]
    arrival: float  # clock() at admission
    deadline: float | None = None  # clock() after which it must not run
    dispatched: float | None = field(default=None)  # clock() when a worker took it
    parts: Parts[R] | None = None  # a streaming caller's intermediate parts (None: not streaming)
    place: int = 0  # its place in a queue with levels: 2 * level (0-based), + 1 once delayed
    delay_at: float | None = None  # clock() after which it is delayed (timeoutAction DELAY)
    timeout_at: float | None = None  # clock() when its level's timeout rejects it (REJECT)
    counted: bool = True  # an inference; a management describe is not (plane/describe.py)


def resolve(future: asyncio.Future, result: object) -> None:
    """Set a result only if the caller still waits (it may have left or been answered)."""
    if not future.done():
        future.set_result(result)


def reject(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class BatchQueue(Generic[T, R]):
    """The bounded, event-driven queue of one model version (see the module docstring)."""

    def __init__(
        self,
        *,
        batch_size: int,
        max_delay_s: float,
        capacity: int,
        probe_interval_s: float = 1.0,
        levels: Levels | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.batch_size = batch_size
        self.max_delay_s = max(0.0, max_delay_s)
        self.capacity = capacity
        self.probe_interval_s = probe_interval_s
        self._items: collections.deque[Pending[T, R]] = collections.deque()
        self._waker: asyncio.Future[None] | None = None
        self._wake_at = 1  # a put wakes the waiting take once this many are queued
        self._until = math.inf  # when the waiting take's window ends (inf: none)
        self._take_lock = asyncio.Lock()
        self._arrivals = 0  # admitted so far (monotonic counter)
        # Arrivals observed while a batch waited, and for how long it waited (decayed sums).
        self._wait_gain = 0.0
        self._wait_time = 0.0
        self._last_wait = float("-inf")
        self._probe_backoff = 1.0  # doubles (to 64x) per probe that gained nothing: c=1 pays less
        self._closed: TorchbayError | None = None
        self.max_wait_s = 0.0  # the queue-time bound (0: off), set by admission.Admission
        self.retry_after: Callable[[], str] = lambda: "1"  # a 503's Retry-After, ditto
        self.expired = 0  # requests answered 503 for waiting past max_wait_s
        self.full = 0  # requests refused because the queue was full
        self.levels = levels  # priority levels / queue policies (None: one plain level)
        # Answers a queued request at its deadline or queue-time bound while no worker looks.
        self._deadlines = Deadlines(self._expire)
        self._dead = 0  # queued requests answered by it, taken out by the next take

    def __len__(self) -> int:
        return len(self._items) - self._dead

    @property
    def remaining_capacity(self) -> int:
        return max(0, self.capacity - len(self))

    def configure(self, *, batch_size: int | None = None, max_delay_s: float | None = None) -> None:
        """Change batching live (management API); takes effect at the next ``take``."""
        if batch_size is not None:
            if batch_size < 1:
                raise ValueError("batch_size must be at least 1")
            self.batch_size = batch_size
        if max_delay_s is not None:
            self.max_delay_s = max(0.0, max_delay_s)
        self._wake()

    # -- producer side ------------------------------------------------------------------------

    def put(self, item: Pending[T, R]) -> None:
        if self._closed is not None:
            raise self._closed
        queued = len(self._items) - self._dead
        if queued >= self.capacity:
            self.put_refused()
        if self.levels is None:
            self._items.append(item)
        else:
            self._put_level(self.levels, item)
        self._arrivals += 1
        if item.deadline is not None or self.max_wait_s > 0:
            self.watch(item)
        if queued + 1 >= self._wake_at:
            self._wake()

    def watch(self, item: Pending[T, R], timer: bool = True) -> None:
        """Answer queued ``item`` at its deadline or queue-time bound should it still wait, and
        end a filling batch in time for it; again when its deadline moved after ``put`` (the
        plane sets a gRPC call's then, ``timer`` False: the transport ends the call at it, which
        is the client leaving, so the queue's timer must not race it)."""
        when = due(item, self.max_wait_s)
        if when == math.inf:
            return  # nothing to watch (no deadline, no queue-time bound)
        if timer:
            self._deadlines.watch(item, when)
        if self._until < math.inf and fill_by((item,), self.max_wait_s) < self._until:
            self._wake()  # the waiting batch's window ends too late for it

    def put_refused(self) -> None:
        """Raise (and count) the full queue's 503."""
        self.full += 1
        raise QueueFull(
            f"The queue of this model is full ({self.capacity} requests waiting); retry later",
            headers={"retry-after": self.retry_after()},
        )

    def _put_level(self, levels: Levels, item: Pending[T, R]) -> None:
        """Queue ``item`` behind the requests of its place, within its level's bound."""
        level = item.place // 2
        bound = levels.policies[level].max_queue_size
        if bound and levels.queued_at(level) >= bound:
            self.full += 1
            raise QueueFull(
                f"The queue of priority level {level + 1} of this model is full ({bound} "
                "requests waiting); retry later",
                headers={"retry-after": self.retry_after()},
                oip_message="Exceeds maximum queue size",  # Triton's words
            )
        self._items.insert(levels.insert_at(item.place), item)

    def requeue_front(self, items: Iterable[Pending[T, R]]) -> None:
        """Give back a batch that could not be dispatched (its worker died before it ran):
        first in the queue, or first at each one's place when the queue has levels."""
        items = list(items)
        for item in items:
            item.dispatched = None  # it is queued again: a caller that leaves now is "queued"
        if self.levels is None:
            self._items.extendleft(reversed(items))
        else:
            for item in reversed(items):
                self._items.insert(self.levels.front_of(item.place), item)
        for item in items:
            self._deadlines.watch(item, due(item, self.max_wait_s))
        self._wake()

    def discard(self, item: Pending[T, R]) -> bool:
        """Take out a queued request whose caller left, so that it neither runs nor holds a
        place of ``capacity``; False when it is not queued. Linear in the queue's length, paid
        only by a caller that leaves. A waiting ``take`` needs no wake: it reads the queue
        afresh when its wait ends."""
        try:
            self._items.remove(item)
        except ValueError:
            return False
        if self.levels is not None:
            self.levels.counts[item.place] -= 1
        return True

    def cancel(self, item: Pending[T, R]) -> bool:
        """Take out a queued request whose caller left (``discard``; a sequence scheduler
        also ends the sequence of a request so cancelled, where its API says so)."""
        return self.discard(item)

    def close(self, exc: TorchbayError) -> list[Pending[T, R]]:
        """Refuse new requests with ``exc``; return (and remove) everything still queued."""
        self._closed = exc
        drained = list(self._items)
        self._items.clear()
        self._dead = 0
        self._deadlines.stop()
        if self.levels is not None:
            self.levels.recount(())
        self._wake()
        return drained

    def reopen(self) -> None:
        """Admit requests again after ``close``."""
        self._closed = None

    def _wake(self) -> None:
        waker = self._waker
        if waker is not None and not waker.done():
            waker.set_result(None)

    # -- consumer side ------------------------------------------------------------------------

    async def take(self, slot: object = None) -> list[Pending[T, R]]:
        """Wait for and return the next batch (never empty). See the module docstring. ``slot``
        (the taking slot) is for schedulers that pick per slot (a sequence model's queue,
        serving/sequences.py); the plain queue serves every slot alike."""
        async with self._take_lock:
            return await self._assemble()

    async def _assemble(self) -> list[Pending[T, R]]:
        loop = asyncio.get_running_loop()
        while True:
            now = clock()
            self._drop_dead(now)
            n = len(self._items)
            if n == 0:
                await self._sleep(loop, None, 1)
                continue
            if n >= self.batch_size:
                return self._pop(self.batch_size, now)
            window_end = min(
                self._items[0].arrival + self.max_delay_s, fill_by(self._items, self.max_wait_s)
            )
            remaining = window_end - now
            if remaining <= 0 or not self._worth_waiting(now, remaining):
                return self._pop(n, now)
            arrivals_before = self._arrivals
            await self._sleep(loop, remaining, self.batch_size)  # not woken per arrival
            waited = clock() - now
            self._learn(self._arrivals - arrivals_before, waited, now)

    def _worth_waiting(self, now: float, remaining: float) -> bool:
        if (
            now - self._last_wait >= self.probe_interval_s * self._probe_backoff
            or self._wait_time <= 0
        ):
            return True  # probe: no fresh evidence either way
        rate = self._wait_gain / self._wait_time  # requests per second while waiting
        return rate * remaining >= 1.0

    def _learn(self, gained: int, waited: float, now: float) -> None:
        decay = 0.8
        self._wait_gain = self._wait_gain * decay + gained
        self._wait_time = self._wait_time * decay + max(waited, 1e-6)
        self._last_wait = now
        self._probe_backoff = 1.0 if gained else min(self._probe_backoff * 2, 64.0)

    async def _sleep(
        self, loop: asyncio.AbstractEventLoop, seconds: float | None, wake_at: int
    ) -> None:
        """Wait until ``wake_at`` requests are queued, ``configure``/``close``/``requeue_front``
        wakes us, or ``seconds`` pass (None: no limit). A batch that fills is not woken by each
        arrival before it is full (a wake per request cost the event loop a timer and a future
        each, and the batch left no sooner)."""
        waker = loop.create_future()
        self._waker = waker
        self._wake_at = wake_at
        self._until = math.inf if seconds is None else clock() + seconds
        timer = loop.call_later(seconds, resolve, waker, None) if seconds is not None else None
        try:
            await waker
        finally:
            if timer is not None:
                timer.cancel()
            self._waker = None
            self._wake_at = 1
            self._until = math.inf

    def _expire(self, item: Pending[T, R], now: float) -> None:
        """``item``'s time came while it is queued (Deadlines): answered as at dispatch, left
        uncounted for the next ``take`` to take out (at once past half, or with levels)."""
        error = self._expiry_of(item, now)
        if error is None:  # its bound moved (max_queue_delay_ms changed)
            self._deadlines.watch(item, due(item, self.max_wait_s))
            return
        reject(item.future, error)
        self._dead += 1
        if self.levels is not None or self._dead * 2 > len(self._items):
            self._drop_dead(now)

    def _expiry_of(self, p: Pending[T, R], now: float) -> TorchbayError | None:
        """The answer of a request that must not run any more at ``now`` (None: it may)."""
        error = expiry(p, now, self.max_wait_s, self.retry_after)
        if isinstance(error, Overloaded):
            self.expired += 1
        elif isinstance(error, QueueTimeout) and self.levels is not None:
            self.levels.timeouts[p.place // 2]["REJECT"] += 1
        return error

    def _drop_dead(self, now: float) -> None:
        items = self._items
        if not items:
            return
        bound = self.max_wait_s if self.max_wait_s > 0 else math.inf
        levels = self.levels
        if all(
            not p.future.done()
            and (p.deadline is None or p.deadline > now)
            and p.arrival + bound > now
            for p in items
        ):
            if levels is not None:
                settle(items, levels, now)  # timeoutAction DELAY: past its timeout, behind
            return
        alive: list[Pending[T, R]] = []
        for p in items:
            if p.future.done():
                continue  # the caller left or was answered already
            error = self._expiry_of(p, now)
            if error is not None:
                reject(p.future, error)
                continue
            alive.append(p)
        items.clear()
        items.extend(alive)
        self._dead = 0
        if levels is not None:
            levels.recount(items)
            settle(items, levels, now)

    def _pop(self, n: int, now: float) -> list[Pending[T, R]]:
        items = self._items
        batch = [items.popleft() for _ in range(n)]
        for p in batch:
            p.dispatched = now
        if self.levels is not None:
            counts = self.levels.counts
            for p in batch:
                counts[p.place] -= 1
        return batch
