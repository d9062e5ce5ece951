"""The request path of a model version: admission, the reader's first answer and the rest, and
what a caller that leaves cancels.

Every admitted request gets exactly one response (serving/model.py says which); a caller that
leaves before its answer cancels it (``finish``). A mixin of :class:`~.model.ModelVersion`,
apart so that the version's lifecycle and its request path each read as one piece.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from torchbay.server.errors import TorchbayError
from torchbay.server.serving import protocol as p
from torchbay.server.serving.admission import refuse
from torchbay.server.serving.parts import NO_PARTS, Parts
from torchbay.server.serving.priority import NO_SCHEDULE, Schedule, level_of, place
from torchbay.server.serving.queue import Pending, clock
from torchbay.server.serving.streams import later_parts

if TYPE_CHECKING:
    from torchbay.server.serving.admission import Admission
    from torchbay.server.serving.launch import ModelSettings
    from torchbay.server.serving.queue import BatchQueue
    from torchbay.server.serving.sequences import SequenceRef


class RequestPath:
    """Admit, read and finish requests; needs the version's queue, admission and settings."""

    queue: BatchQueue[p.WireRequest, p.WireResponse]
    admission: Admission
    settings: ModelSettings
    cancelled: dict[str, int]
    inflight: int
    requests_received: int
    requests_rejected: int
    last_used: float

    def admit(
        self,
        request: p.WireRequest,
        sequence: SequenceRef | None = None,
        schedule: Schedule = NO_SCHEDULE,
    ) -> Pending[p.WireRequest, p.WireResponse]:
        """Queue one request: on ``sequence`` for a sequence model (serving/sequences.py), else
        at its priority level (``schedule``, serving/priority.py). Raises QueueFull / NoWorker /
        ShuttingDown / Overloaded / a refused sequence's 400 at once (a priority past the
        model's levels runs at its default level)."""
        level = level_of(self.queue.levels, schedule)
        self.requests_received += 1
        try:
            return self._admit(request, sequence, level, schedule.timeout_us)
        except TorchbayError:
            self.requests_rejected += 1
            self.admission.refused()
            raise

    def _admit(
        self,
        request: p.WireRequest,
        sequence: SequenceRef | None,
        level: int,
        timeout_us: int | None,
    ) -> Pending[p.WireRequest, p.WireResponse]:
        refuse(self, level)  # 503 at once: shutting down, no worker, over max_queue_delay_ms
        loop = asyncio.get_running_loop()
        self.last_used = now = clock()
        timeout_ms = self.settings.client_timeout_ms
        item: Pending[p.WireRequest, p.WireResponse] = Pending(
            request, loop.create_future(), now, now + timeout_ms / 1000 if timeout_ms else None
        )
        if sequence is not None:  # a sequence model's queue is a SequenceQueue
            self.queue.put(item, sequence, timeout_us)  # type: ignore[call-arg]
            return item
        if self.queue.levels is not None:
            place(item, self.queue.levels, level, timeout_us, now)
        self.queue.put(item)
        return item

    def admit_reader(
        self,
        request: p.WireRequest,
        admitted: Callable[[Pending], None] | None = None,
        sequence: SequenceRef | None = None,
        schedule: Schedule = NO_SCHEDULE,
    ) -> Pending[p.WireRequest, p.WireResponse]:
        """Admit ``request`` for a reader: its future gives the first answer (a part, or the final
        response when nothing streams), ``rest`` the others; then ``finish``. Raises as admit."""
        item = self.admit(request, sequence, schedule)
        if admitted is not None:
            admitted(item)
        item.parts = Parts()
        self.inflight += 1
        return item

    def rest(self, item: Pending) -> AsyncIterator[p.WireResponse]:
        """After a first part: each later part, then the final response (skipped when empty: a
        generator handler's end); NO_PARTS, not a generator, when the first was the final."""
        return later_parts(item, item.parts) if item.parts.started else NO_PARTS

    def finish(self, item: Pending) -> None:
        """The reader is done. One that left before its answer (its future cancelled here, or by
        its caller: a gRPC call's task, an HTTP disconnect) cancels the request: still queued,
        it is taken out and never runs (a sequence that Triton's API opened ends with it:
        ``SequenceQueue.cancel``); running, its result is dropped (and its worker told,
        streams.py), the worker kept. Either way it is counted in ``cancelled``."""
        self.inflight -= 1
        future = item.future
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            return  # answered
        queued = item.dispatched is None  # no worker took it
        if queued:
            self.queue.cancel(item)
        self.cancelled["queued" if queued else "running"] += 1

    async def stream(
        self, request: p.WireRequest, admitted: Callable[[Pending], None] | None = None
    ) -> AsyncIterator[p.WireResponse]:
        """``admit_reader``, the first answer, ``rest``, ``finish``: closing early cancels."""
        item = self.admit_reader(request, admitted)
        try:
            yield await item.future
            async for response in self.rest(item):
                yield response
        finally:
            self.finish(item)
