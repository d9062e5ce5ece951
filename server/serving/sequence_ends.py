"""How a sequence of the sequence scheduler (serving/sequences.py) ends: its end request, a
start that joins it after its end, its idle and total limits, a request's timeout while it
waits for a slot, a queued request's cancel (Triton's API), its worker's death; and the one
timer at the earliest limit. Torch-free."""

from __future__ import annotations

import asyncio
import collections

from torchbay.server.errors import RequestTimeout, TorchbayError
from torchbay.server.serving.queue import Pending, clock, reject
from torchbay.server.serving.sequence_types import (
    Ended,
    Sequence,
    SequenceCancelled,
    SequenceExpired,
    SequenceLost,
    SequenceRefused,
    holds,
)

# Triton's default max_sequence_idle_microseconds: the idle limit of a sequence opened with
# ``sequence_start`` when the model sets none.
TRITON_IDLE_S = 1.0
# Ended sequences remembered (to refuse their next request with the reason), oldest forgotten.
REMEMBERED = 65_536


class SequenceEnds:
    """The ends of ``SequenceQueue``'s sequences (a mixin: it reads the queue's state)."""

    open: dict[str | int, Sequence]
    ended: dict[str, int]
    idle_s: float
    timeout_s: float
    _ended: collections.OrderedDict[str | int, Ended]
    _of: dict[Pending, Sequence]
    _timer: asyncio.TimerHandle | None

    def discard(self, item: Pending) -> bool:
        raise NotImplementedError

    def _wake_all(self) -> None:
        raise NotImplementedError

    def _backlogged(self) -> bool:
        raise NotImplementedError

    def cancel(self, item: Pending) -> bool:
        """Take out queued ``item``, whose caller left. Its sequence, when Triton's API opened
        it (``sequence_start``), ends with it, as Triton's sequence batcher cancels the
        sequence of a cancelled request: its other queued requests are answered cancelled
        (``SequenceCancelled``), its running one answers, and its next request needs a start.
        A sequence of TorchServe's API goes on as if ``item`` had never been sent
        (``discard``)."""
        seq = self._of.get(item)
        if seq is None or seq.implicit:
            return self.discard(item)
        reason = "was cancelled: a request of it was cancelled while it waited"
        self._end(seq, reason, "cancelled", error=SequenceCancelled)
        return True

    def _supersede(self, seq: Sequence, start: Pending) -> None:
        """``start`` joins ``seq`` after its end: the sequence that ends is counted once its end
        request is answered (or now, if it was answered or the handler ended it)."""
        end = seq.end_request if seq.end_request in seq.items else None
        if end is None and seq.running:
            seq.end_ran = True
        elif end is None:
            self.ended["end"] += 1
        seq.superseded[start] = end

    def _unsupersede(self, seq: Sequence, start: Pending, after: Pending | None) -> None:
        """A start that joined ``seq`` after its end request left before it ran: the end
        stands, and the sequence ends with it (at once if it was answered) unless a request
        was queued after the start (``after``: the sequence goes on with it)."""
        end = seq.superseded.pop(start)
        if after is not None:
            seq.superseded[after] = end
            return
        seq.ending, seq.end_request = True, end
        if end is None and seq.running:  # its end runs: counted as the sequence's at release
            seq.end_ran = False
        elif end is None and self.open.get(seq.id) is seq:  # counted when it was answered
            self._end(seq, "has ended", "end", count=False)

    def _sweep(self, now: float) -> None:
        """End the sequences whose limits passed or whose worker is gone; drop the queued
        requests whose caller left or whose deadline passed."""
        for seq in list(self.open.values()):
            if seq.slot is not None and not holds(seq):
                self._end(seq, "was lost: its worker died or was replaced", "worker")
            elif self.timeout_s and now - seq.opened >= self.timeout_s:
                limit = f"{self.timeout_s * 1000:g} ms (sequenceTimeoutMSec)"
                self._end(seq, f"was closed after its time limit of {limit}", "timeout")
            elif self._expired(seq, now):
                reason = "was closed: a request's timeout expired while it waited for a slot"
                self._end(seq, reason, "timeout", error=SequenceExpired)
            elif self._idle(seq) and now - seq.last >= self._idle_limit(seq):
                self._end(seq, self._idle_reason(seq), "idle", idle=True)
            else:
                self._drop_expired(seq, now)
        self._arm()

    def _expired(self, seq: Sequence, now: float) -> bool:
        """``seq`` waited unbound past a request's timeout while no slot had room for it. A
        slot has room now: it binds it when it next takes, and the timeout no longer counts
        (Triton would have given it that slot at once)."""
        if seq.slot is not None or seq.expires is None or now < seq.expires:
            return False
        if self._backlogged():
            return True
        seq.expires = None
        return False

    def _idle(self, seq: Sequence) -> bool:
        """``seq`` has nothing queued, running or streaming: its idle limit runs."""
        return not (seq.items or seq.running or seq.streaming)

    def _idle_limit(self, seq: Sequence) -> float:
        """Seconds ``seq`` may idle: ``sequenceMaxIdleMSec`` when the model sets one, else the
        default of the API that opened it. TorchServe's closes once idle (TorchServe polls its
        job group with that 0 ms wait), else every id-less request would hold a place of
        ``maxNumSequence`` for ever; named again, it reopens on its worker (``_open``).
        Triton's (a ``sequence_start``) idles for Triton's default of 1 s, else an abandoned
        sequence would hold its place for ever and every new one get 503."""
        if self.idle_s:
            return self.idle_s
        return 0.0 if seq.implicit else TRITON_IDLE_S

    def _idle_reason(self, seq: Sequence) -> str:
        if self.idle_s:
            return f"was closed after idling past {self.idle_s * 1000:g} ms (sequenceMaxIdleMSec)"
        return (
            f"was closed after idling past {TRITON_IDLE_S * 1000:g} ms (Triton's default idle "
            "limit: the model sets no sequenceMaxIdleMSec)"
        )

    def _drop_expired(self, seq: Sequence, now: float) -> None:
        for item in list(seq.items):
            if self.open.get(seq.id) is not seq:  # a request's cancel ended it
                return
            if item.future.cancelled():  # its caller left, before its reader's ``finish``
                self.cancel(item)
            elif item.future.done() or (item.deadline is not None and item.deadline <= now):
                self._expire(item, now)

    def _expire(self, item: Pending, now: float) -> None:
        """``item`` waited past its deadline (or its caller left): answered, taken out."""
        reject(item.future, RequestTimeout("The request waited past its deadline; not run"))
        self.discard(item)

    def _end(
        self,
        seq: Sequence,
        reason: str,
        why: str,
        idle: bool = False,
        fail: bool = True,
        count: bool = True,
        error: type[TorchbayError] | None = None,
    ) -> None:
        """Close ``seq``; its queued requests (if any) are answered with the reason."""
        self.open.pop(seq.id, None)
        self.ended[why] += count
        if seq.end_ran:  # the sequence a start joined ended by its end, which ran: counted here,
            seq.end_ran = False  # as the id's release would have counted it
            self.ended["end"] += 1
        error = error or (SequenceLost if why == "worker" else SequenceRefused)
        for item in list(seq.items):
            self.discard(item)
            if fail:
                reject(item.future, error(f"Sequence {seq.id!r} {reason}; not run"))
        self._ended[seq.id] = Ended(reason, seq.slot, seq.worker, idle)
        while len(self._ended) > REMEMBERED:
            self._ended.popitem(last=False)
        self._wake_all()

    def _arm(self) -> None:
        """One timer at the earliest idle or total limit of the open sequences."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        limits = []
        for seq in self.open.values():
            if self.timeout_s:
                limits.append(seq.opened + self.timeout_s)
            if self._idle(seq):
                limits.append(seq.last + self._idle_limit(seq))
            if seq.slot is None and seq.expires is not None:
                limits.append(seq.expires)
        if limits:
            delay = max(0.0, min(limits) - clock()) + 0.001
            self._timer = asyncio.get_running_loop().call_later(delay, self._sweep_now)

    def _sweep_now(self) -> None:
        self._timer = None
        self._sweep(clock())
