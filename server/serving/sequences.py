"""Sequences of a stateful model: every request of one sequence runs on the same worker, in
order, one at a time. It takes the place of a sequence model's ``BatchQueue`` (whose contract it
keeps: ``put`` never waits, ``take`` returns a non-empty batch, ``discard``, ``close``).

* A sequence is opened by its first request (TorchServe: any request naming an unknown id, or
  none: the plane names it; Triton: a request with ``sequence_start``) and bound to one slot, and
  so to that slot's worker process, when a slot first takes it. A slot binds a new sequence
  only while no other live slot holds fewer (least loaded first); with the ``direct``
  strategy a slot holds at most ``batch_size`` sequences (one batch lane each) and the others
  wait unbound, with ``oldest`` it holds any number. A sequence is keyed by its id as text
  (the handler reads it so): the integer 5 and the string "5" are one sequence.
* Each sequence has its own FIFO (``maxSequenceJobQueueSize``). A slot's batch takes the head
  of each of its sequences that is not running, oldest first, at most ``batch_size``: never two
  requests of one sequence in a batch, never one before the previous one is answered. A slot
  calls ``take`` again only once its batch is answered, so that call releases its sequences.
  A batch leaves at once (the next request of a sequence usually waits for this answer).
* A sequence ends after its request with ``sequence_end``; it is closed when it idles past
  ``sequenceMaxIdleMSec`` (without it, one of TorchServe's API once idle, as TorchServe drops
  its job group, and one of Triton's after Triton's default of 1 s), lives past
  ``sequenceTimeoutMSec``, or waits unbound past a request's ``timeout`` (Triton's backlog,
  answered 503; the ends: sequence_ends.py); it fails when its worker dies
  or is replaced (the handler's state died with it): its queued requests are answered 503 and
  the id is remembered, so that its next request is refused with the reason, never silently
  run on a fresh state. TorchServe's API reopens an idle-closed id on the same, still living,
  worker (TorchServe reopens it too, as a new job group; its handlers keep their state per
  worker); anything else needs a new start.
* At most ``maxNumSequence`` sequences are open (at least ``batch_size`` x ``maxWorkers``, as in
  TorchServe); a new one past that is refused 503 with Retry-After, as TorchServe refuses it.

Torch-free; it knows slots only as objects with a ``worker`` (whose ``alive`` and ``exited``
it reads), ``retiring`` and ``gave_up``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Iterable
from typing import Any

from torchbay.server.errors import QueueFull, TorchbayError
from torchbay.server.serving.queue import BatchQueue, Pending, clock, reject, resolve
from torchbay.server.serving.sequence_ends import SequenceEnds
from torchbay.server.serving.sequence_types import (
    Ended,
    Sequence,
    SequenceCancelled,
    SequenceExpired,
    SequenceLost,
    SequenceRef,
    SequenceRefused,
    gone_for_good,
    holds,
    lives,
    slot_alive,
)

__all__ = [
    "SequenceCancelled",
    "SequenceExpired",
    "SequenceLost",
    "SequenceQueue",
    "SequenceRef",
    "SequenceRefused",
]


def _keyed(ref: SequenceRef) -> SequenceRef:
    """``ref`` with its id as text: the handler reads the id as a header's text (and CORRID
    from it), so the integer 5 and the string "5" name one sequence, never two whose requests
    would share one state, side by side."""
    return ref if isinstance(ref.id, str) else dataclasses.replace(ref, id=str(ref.id))


class SequenceQueue(SequenceEnds, BatchQueue):
    """The sequence scheduler of one model version (see the module docstring)."""

    def __init__(
        self,
        *,
        batch_size: int,
        max_delay_s: float,
        capacity: int,
        max_sequences: int,
        per_sequence: int,
        idle_s: float = 0.0,
        timeout_s: float = 0.0,
        strategy: str = "oldest",
    ) -> None:
        super().__init__(batch_size=batch_size, max_delay_s=max_delay_s, capacity=capacity)
        self.max_sequences = max_sequences
        self.per_sequence = per_sequence
        self.idle_s = idle_s
        self.timeout_s = timeout_s
        self.strategy = strategy
        self.open: dict[str | int, Sequence] = {}
        self._ended: collections.OrderedDict[str | int, Ended] = collections.OrderedDict()
        self._of: dict[Pending, Sequence] = {}  # every queued request's sequence
        self._queued = 0
        self._wakers: dict[Any, asyncio.Future[None]] = {}  # slots waiting in take
        self._slots: dict[Any, None] = {}  # every slot that took and may take again, in order
        self._timer: asyncio.TimerHandle | None = None
        self._watched: set[Any] = set()  # workers whose exit sweeps
        self.ended = {"end": 0, "idle": 0, "timeout": 0, "worker": 0, "cancelled": 0, "refused": 0}

    def __len__(self) -> int:
        return self._queued

    @property
    def remaining_capacity(self) -> int:
        return max(0, self.capacity - self._queued)

    def describe(self) -> dict[str, Any]:
        return {
            "openSequences": len(self.open),
            "sequencesEnded": dict(self.ended),
        }

    # -- producer side ------------------------------------------------------------------------

    def put(
        self, item: Pending, ref: SequenceRef | None = None, timeout_us: int | None = None
    ) -> None:
        """Queue ``item`` on its sequence (None: a sequence of its own, started and ended).
        ``timeout_us`` (the request's ``timeout``): as Triton's, the longest its sequence may
        wait for a slot (unbound; ``direct``'s lanes all taken, or no live slot): past it the
        sequence's queued requests are answered 503 and it ends. Only while no slot has
        room for it (``_backlogged``): with room, Triton gives it a slot at once."""
        if self._closed is not None:
            raise self._closed
        if ref is None:
            # implicit: should its caller leave, it never happened (``cancel``: ``discard``)
            ref = SequenceRef(f"torchbay-{id(item):x}", start=True, end=True, implicit=True)
        ref = _keyed(ref)
        if self._queued >= self.capacity:
            self.put_refused()
        seq = self._current(ref)
        if seq is None:
            seq = self._open(ref)
        elif seq.ending and not ref.start:
            raise SequenceRefused(f"Sequence {ref.id!r} has ended; start a new one")
        elif len(seq.items) >= self.per_sequence:
            self.full += 1
            raise QueueFull(
                f"Sequence {ref.id!r} already has {self.per_sequence} requests waiting "
                "(maxSequenceJobQueueSize); retry later",
                headers={"retry-after": self.retry_after()},
            )
        elif ref.start:  # a new sequence under its id: its time limit counts from here
            seq.opened, seq.restart = item.arrival, item
            if seq.ending:
                self._supersede(seq, item)
        seq.ending = ref.end
        seq.end_request = item if ref.end else None
        seq.items.append(item)
        seq.last = item.arrival
        self._of[item] = seq
        self._queued += 1
        self._arrivals += 1
        self.watch(item)
        if timeout_us and seq.slot is None and self._backlogged():
            expires = item.arrival + timeout_us / 1e6
            seq.expires = expires if seq.expires is None else min(seq.expires, expires)
            self._arm()
        self._wake_for(seq)

    def _current(self, ref: SequenceRef) -> Sequence | None:
        """The open sequence ``ref`` joins (None: it opens one). A start for an open id joins
        it, behind its queued requests and on its worker, as Triton runs it (the previous
        sequence ends early; the handler sees the start) and TorchServe (its job group); one
        whose worker is gone is ended first, so that the start opens a new one."""
        seq = self.open.get(ref.id)
        if seq is not None and ref.start and seq.slot is not None and not holds(seq):
            self._sweep(clock())
            seq = self.open.get(ref.id)
        return seq

    def watch(self, item: Pending, timer: bool = True) -> None:
        """Answer queued ``item`` at its deadline should it still wait (deadlines.py); ``timer``
        False: nothing (a gRPC deadline, which the transport ends the call at)."""
        if timer and item.deadline is not None:
            self._deadlines.watch(item, item.deadline)

    def _open(self, ref: SequenceRef) -> Sequence:
        ended = self._ended.get(ref.id)
        reopen = ended is not None and ended.idle and ref.implicit and lives(ended)
        if ended is not None and not ref.start and not reopen:
            self.ended["refused"] += 1
            raise SequenceRefused(f"Sequence {ref.id!r} {ended.reason}; start a new sequence")
        if ended is None and not ref.start and not ref.implicit:
            raise SequenceRefused(
                f"Sequence {ref.id!r} is not open: its first request must set sequence_start"
            )
        if len(self.open) >= self.max_sequences:
            self.full += 1
            raise QueueFull(
                f"This model already has {self.max_sequences} open sequences (maxNumSequence); "
                "retry later",
                headers={"retry-after": self.retry_after()},
            )
        self._ended.pop(ref.id, None)
        now = clock()
        seq = Sequence(ref.id, now, now, implicit=ref.implicit)
        if reopen:
            assert ended is not None
            seq.slot, seq.worker, seq.ran = ended.slot, ended.worker, True
        self.open[ref.id] = seq
        self._arm()
        return seq

    def discard(self, item: Pending) -> bool:
        """Take out a queued request that will never run (its caller left, its deadline
        passed). It never happened: an end request that leaves does not end its sequence, and
        a sequence none of whose requests ran (its start left) is no longer open."""
        seq = self._of.pop(item, None)
        if seq is None:
            return False
        at = seq.items.index(item)
        after = seq.items[at + 1] if at + 1 < len(seq.items) else None
        del seq.items[at]
        self._queued -= 1
        if seq.end_request is item:
            seq.ending, seq.end_request = False, None
        if seq.superseded:
            seq.superseded = {s: e for s, e in seq.superseded.items() if e is not item}
        if item in seq.superseded:
            self._unsupersede(seq, item, after)
        if not seq.ran and not seq.items and self.open.get(seq.id) is seq:
            del self.open[seq.id]
            self._arm()
        return True

    def requeue_front(self, items: Iterable[Pending]) -> None:
        """A batch whose worker died before it ran: its sequences' state is gone with it."""
        for item in items:
            reject(item.future, SequenceLost("The worker of this sequence died; not run"))
        self._sweep(clock())

    def close(self, exc: TorchbayError) -> list[Pending]:
        self._closed = exc
        drained = [item for seq in self.open.values() for item in seq.items]
        for seq in list(self.open.values()):
            self._end(seq, "was closed: the model stopped serving", "worker", fail=False)
        self._of.clear()
        self._queued = 0
        self._deadlines.stop()
        for waker in self._wakers.values():
            resolve(waker, None)
        return drained

    # -- consumer side ------------------------------------------------------------------------

    async def take(self, slot: Any = None) -> list[Pending]:
        """The next batch of ``slot``: at most one request of each of its sequences."""
        self._joined(slot)
        self._release(slot)
        loop = asyncio.get_running_loop()
        while True:
            now = clock()
            self._sweep(now)
            self._bind(slot)
            batch = self._pick(slot, now)
            if batch:
                return batch
            waker = self._wakers[slot] = loop.create_future()
            try:
                await waker
            finally:
                self._wakers.pop(slot, None)

    def _joined(self, slot: Any) -> None:
        """``slot`` takes: it is among the slots, which forget those gone for good (retired,
        given up), so that a model scaled down and up again keeps no slot it dropped."""
        for gone in [s for s in self._slots if gone_for_good(s)]:
            del self._slots[gone]
        self._slots.setdefault(slot, None)

    def _release(self, slot: Any) -> None:
        """``slot``'s previous batch is answered: its sequences may run again."""
        now = clock()
        for seq in list(self.open.values()):
            if seq.slot is slot and seq.running:
                seq.running = False
                seq.last = now
                if seq.end_ran:  # the end of a sequence that a start joined: it ended here
                    seq.end_ran = False
                    self.ended["end"] += 1
                if seq.ending and not seq.items:
                    self._end(seq, "has ended", "end")

    def _bind(self, slot: Any) -> None:
        """Bind waiting unbound sequences to ``slot`` while it is among the least loaded."""
        worker = getattr(slot, "worker", None)
        for seq in self.open.values():
            if seq.slot is not None or not seq.items:
                continue
            load = self._load(slot)
            if self.strategy == "direct" and load >= self.batch_size:
                return
            if any(self._load(other) < load for other in self._live_slots() if other is not slot):
                return
            seq.slot, seq.worker, seq.expires = slot, worker, None
            self._watch(worker)

    def _watch(self, worker: Any) -> None:
        """Sweep once ``worker`` exits (its sequences fail at once); one callback per worker."""
        exited = getattr(worker, "exited", None)
        if exited is None or worker in self._watched:
            return
        self._watched.add(worker)
        exited.add_done_callback(lambda _: (self._watched.discard(worker), self._sweep(clock())))

    def _backlogged(self) -> bool:
        """No live slot has room for another sequence (``direct``: every lane taken; any
        strategy: no live slot), so that a sequence not yet bound waits in what Triton calls
        its backlog, where a request's timeout counts. (Triton gives a sequence a slot on its
        arrival; here a slot with room binds it when it next takes, once its batch is done.)"""
        room = (
            s
            for s in self._live_slots()
            if self.strategy != "direct" or self._load(s) < self.batch_size
        )
        return next(room, None) is None

    def _load(self, slot: Any) -> int:
        return sum(1 for seq in self.open.values() if seq.slot is slot)

    def _live_slots(self) -> list[Any]:
        return [s for s in self._slots if slot_alive(s)]

    def _pick(self, slot: Any, now: float) -> list[Pending]:
        ready = [s for s in self.open.values() if s.slot is slot and s.items and not s.running]
        ready.sort(key=lambda s: s.items[0].arrival)
        return [self._took(seq, now) for seq in ready[: self.batch_size]]

    def _took(self, seq: Sequence, now: float) -> Pending:
        """The head of ``seq``, taken into a batch."""
        item = seq.items.popleft()
        del self._of[item]
        self._queued -= 1
        item.dispatched = now
        seq.running = seq.ran = True
        if item in seq.superseded.values():  # an end that a start joined: counted once answered
            seq.end_ran = True
            seq.superseded = {s: e if e is not item else None for s, e in seq.superseded.items()}
        seq.superseded.pop(item, None)  # a start that runs: the previous sequence is over
        return item

    def _wake_for(self, seq: Sequence) -> None:
        if seq.slot is None:
            self._wake_all()
        elif (waker := self._wakers.get(seq.slot)) is not None:
            resolve(waker, None)

    def _wake_all(self) -> None:
        for waker in list(self._wakers.values()):
            resolve(waker, None)

    def _wake(self) -> None:  # configure(): the batch size changed
        self._wake_all()
