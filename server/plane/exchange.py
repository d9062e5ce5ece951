"""One inference request through the data plane, whatever protocol brought it.

An :class:`Exchange` is the request's steps, written once: find the model version and refuse at
once what its admission refuses (:meth:`Exchange.resolve`, from the headers alone), queue the
request with its deadline (:meth:`Exchange.admit`, or :meth:`Exchange.admit_all` for KServe v1's
instances), hand the protocol the first answer and the rest of the stream, and, when the protocol
has answered, record it once: the metrics, the Triton statistics and the access line
(:meth:`Exchange.close`, run by the ``with`` block), and, when Triton's trace extension samples
it (``plane/trace.py``), write its trace. A request to a model version that enables the
response cache (``plane/cache.py``) is looked up in :meth:`Exchange.admit` first: a hit is
answered there, without a worker, and still recorded as one request. A request to a sequence
model is read for its sequence first (``plane/sequence_params.py``: a 400 for a bad id) and
queued on it (``serving/sequences.py``), never cached. A protocol adapter parses
its wire format, calls these, and writes what comes back in its own format; it sets
:attr:`Exchange.status` to the status it answered, and an error raised through the block records
that error's status.

    with plane.exchange(scope, name, version) as ex:
        mv = ex.resolve()
        item = ex.admit(wire, deadline_s=remaining)
        ...
        ex.status = 200

The record's ``scope`` is an ASGI scope, or its few keys for gRPC (method, path, version): the
access line reads ``client``, ``method``, ``path`` and ``http_version``. Torch-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from torchbay.server.errors import (
    HandlerFailed,
    ModelNotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    StreamNotSupported,
    TorchbayError,
)
from torchbay.server.observe.logs import RequestRecord
from torchbay.server.plane.schedule import schedule_of
from torchbay.server.plane.sequence_params import check_ignored, sequence_of
from torchbay.server.plane.triton_config import batched, inferences
from torchbay.server.serving import protocol as p
from torchbay.server.serving.admission import refuse_early
from torchbay.server.serving.parts import NO_PARTS, Parts
from torchbay.server.serving.priority import Schedule
from torchbay.server.serving.queue import Pending, clock

if TYPE_CHECKING:
    from torchbay.server.plane.cache import Lookup, ResponseCache
    from torchbay.server.plane.trace import Trace, Tracer
    from torchbay.server.serving.model import ModelVersion
    from torchbay.server.serving.registry import ModelRegistry

Scope = MutableMapping[str, Any]
Item = Pending[p.WireRequest, p.WireResponse]
RecordFn = Callable[[RequestRecord], None]  # the plane's recorder (metrics, statistics, access)
# The registered shared-memory regions a v2 request carries to its worker (plane/shm.py), and the
# ones it names, held until ``Wiring.release``.
RegionsFn = Callable[[p.WireRequest], "tuple[dict[str, list[Any]] | None, tuple[str, ...]]"]
log = logging.getLogger("torchbay.trace")
# The status recorded for a caller that left (a gRPC cancel or deadline, an HTTP disconnect)
# before its answer.
CLIENT_LEFT = 499


@dataclass(frozen=True, slots=True)
class Wiring:
    """What every exchange of one server shares; the plane builds it once."""

    registry: ModelRegistry
    record: RecordFn  # metrics, statistics and access line
    regions: RegionsFn | None = None  # Triton's shared-memory regions (plane/shm.py)
    tracer: Tracer | None = None  # Triton's trace extension (plane/trace.py)
    cache: ResponseCache | None = None  # the response cache (plane/cache.py)
    starting: Callable[[], bool] = lambda: False  # the start-up models are not all in yet
    # Lets go of the regions ``regions`` held for a request, once its exchange closes.
    release: Callable[[tuple[str, ...]], None] | None = None


@dataclass(slots=True, eq=False)
class Exchange:
    """The steps of one request (see the module docstring); a context manager that records."""

    wiring: Wiring
    scope: Scope
    name: str
    version: str | None
    started: float = field(default_factory=time.perf_counter)
    model: ModelVersion | None = None
    items: list[Item] = field(default_factory=list)
    status: int = 500  # until the protocol says what it answered
    trace: Trace | None = None  # Triton's trace extension sampled this request
    closed: bool = False
    level: int | None = None  # its 0-based priority level, on a model with levels
    cached: Lookup | None = None  # a cache miss: its answer withdrawn if the protocol failed it
    held: list[tuple[str, ...]] = field(default_factory=list)  # regions, released at close

    def __enter__(self) -> Exchange:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.status = status_of(exc, self.status)
        self.close()

    # -- the steps ------------------------------------------------------------------------------

    def resolve(self) -> ModelVersion:
        """The model version named, refused at once (503) when it refuses newcomers: a shutting
        down, workerless or overloaded version. Raises the error tree's 404 / 400 / 503."""
        try:
            mv = self.model = self.wiring.registry.resolve(self.name, self.version)
        except ModelNotFound:
            if not self.wiring.starting():
                raise
            # Maybe a start-up model still on its way in (TorchServe listens only then): 503,
            # which a client retries, rather than 404.
            raise ServiceUnavailable(
                f"Model {self.name!r} is not loaded yet: the server is starting"
            ) from None
        tracer = self.wiring.tracer
        if tracer is not None and tracer.active:
            self.trace = tracer.start(self.name, self.started)
        # From the headers alone (the protocol has not read the body); but a full queue or an
        # overload does not refuse a request the response cache may answer (Triton looks up first)
        cache = self.wiring.cache
        refuse_early(mv, pressure=cache is None or cache.of(mv) is None)
        return mv

    def admit(self, wire: p.WireRequest, deadline_s: float | None = None) -> Item:
        """Queue ``wire`` for a reader (its future: the first answer; ``rest``: the others; the
        block's end: ``finish``). ``deadline_s`` (seconds from now, a gRPC deadline) becomes its
        deadline when earlier than the model's ``clientTimeoutInMills``: still queued then, it is
        answered 504 and never runs. Its priority and timeout (plane/schedule.py) place it
        among the model's levels. Raises 503 (queue full, no worker, shutting down), 400 (a
        bad priority or timeout).
        A response cache hit comes back answered, with nothing queued; a miss's answer is
        offered to the cache once it comes, and withdrawn at ``close`` unless the protocol
        answered it 200."""
        assert self.model is not None, "resolve() first"
        sequence = None
        if self.model.settings.sequence_mode:  # never cached (a sequence's answers differ)
            names = self.model.settings.sequence_headers
            sized = partial(batched, self.model)  # asked only of a request of several rows
            wire, sequence = sequence_of(wire, self._max_size(), names, sized, self.model.name)
        elif wire.protocol == "v2":  # ignored, but checked as Triton does
            check_ignored(wire, self._max_size())
        # Read before the look-up: a hit is counted at its priority level as any answer.
        schedule = self._leveled(schedule_of(wire, self._max_size()))
        lookup = self._lookup(wire, sequence is None)
        if lookup is not None and lookup.hit is not None:
            return self._answered(wire, lookup.hit)
        if wire.protocol == "v2":
            wire = self._v2_facts(wire)
        item = self.model.admit_reader(wire, sequence=sequence, schedule=schedule)
        self.items.append(item)
        if self.trace is not None:
            item.future.add_done_callback(self._responded)
        if lookup is not None:
            item.future.add_done_callback(_offer(lookup))
            self.cached = lookup
        if deadline_s is not None:  # a gRPC deadline: the transport ends the call at it (a 499)
            with_deadline(item, deadline_s)
            self.model.queue.watch(item, timer=False)  # a filling batch leaves in time for it
        return item

    def _v2_facts(self, wire: p.WireRequest) -> p.WireRequest:
        """An OIP request with what its worker checks it against: the shared-memory regions
        its tensors may sit in, and Triton's max_batch_size, the model's batch size (what its
        configuration shows) once declared above TorchServe's default of 1 (at 1 each request
        runs alone, whatever its batch dimension: a limit nobody declared is not enforced)."""
        assert self.model is not None
        regions = self.wiring.regions
        table, named = regions(wire) if regions is not None else (None, ())
        if named:
            self.held.append(named)
        batch_size = self.model.settings.batch_size
        if table is None and batch_size == 1:
            return wire
        bound = batch_size if batch_size > 1 else 0
        return dataclasses.replace(wire, regions=table, max_batch=bound)

    def _max_size(self) -> int:
        """The most bytes a request body may be, inflated too (``max_request_size``)."""
        return self.wiring.registry.config.max_request_size

    def _leveled(self, schedule: Schedule) -> Schedule:
        """``schedule``, its level noted when the model has levels."""
        assert self.model is not None
        levels = self.model.queue.levels
        if levels is not None and self.level is None:
            self.level = levels.level_of(schedule.priority)
        return schedule

    def _lookup(self, wire: p.WireRequest, cacheable: bool) -> Lookup | None:
        """The cache's look-up of ``wire`` (None: no cache, or not to be cached)."""
        if self.wiring.cache is None:
            return None
        assert self.model is not None
        path = str(self.scope.get("path", ""))
        return self.wiring.cache.lookup(self.model, wire, path, cacheable)

    def _answered(self, wire: p.WireRequest, response: p.WireResponse) -> Item:
        """An item already answered with ``response`` (a cache hit), with nothing to stream
        (``rest`` is empty). It was never queued nor in flight, so it is not among ``items``:
        the record has no queue time, and a trace only REQUEST_START and REQUEST_END."""
        assert self.model is not None
        future = asyncio.get_running_loop().create_future()
        future.set_result(response)
        self.model.requests_received += 1  # describe's request count: a hit is a request
        return Pending(wire, future, clock(), parts=Parts())

    def admit_all(self, wires: Iterable[p.WireRequest], count: int) -> list[Item]:
        """Queue every request before any is awaited (KServe v1's instances); when one is
        refused, the ones queued before it are cancelled (the batcher skips them) and the
        refusal is raised. The block's end finishes them all. Each is admitted with a reader
        of parts (``rest``): a streaming handler's parts are the caller's to gather. ``wires``
        (``count`` of them) is read one at a time, each admitted before the next is made: a
        refusal (the queue's bound) stops it, so a body of a million instances makes no more
        requests than fit. More than the model's queue holds at all are a 413: that call could
        never be queued whole (a 503 "queue full, retry later" it got was retried in vain)."""
        mv = self.model
        assert mv is not None, "resolve() first"
        try:
            for wire in wires:
                schedule = self._leveled(schedule_of(wire))
                if not self.items:  # the first: its level is known now
                    self._whole(count)
                self.items.append(item := mv.admit_reader(wire, schedule=schedule))
                if self.trace is not None:
                    item.future.add_done_callback(self._responded)
        except TorchbayError:
            for item in self.items:
                item.future.cancel()
            raise
        return list(self.items)

    def _whole(self, count: int) -> None:
        """A 413 for ``count`` requests that could never be queued together: more than the
        model's queue holds, or than the one of their priority level (its ``max_queue_size``)."""
        assert self.model is not None
        queue = self.model.queue
        bound, where = queue.capacity, "the queue of this model"
        if queue.levels is not None and self.level is not None:
            own = queue.levels.policies[self.level].max_queue_size
            if own and own < bound:
                bound, where = own, f"the queue of priority level {self.level + 1} of this model"
        if count > bound:
            raise PayloadTooLarge(
                f"{count} instances are more than {where} holds ({bound}); send at most "
                f"{bound} in one call"
            )

    def rest(self, item: Item) -> AsyncIterator[p.WireResponse]:
        """After ``item``'s first answer: its later parts, then its final response."""
        assert self.model is not None
        rest = self.model.rest(item)
        return rest if self.trace is None or rest is NO_PARTS else self._traced(rest)

    async def _traced(self, rest: AsyncIterator[p.WireResponse]) -> AsyncIterator[p.WireResponse]:
        """``rest``, each response's arrival noted in the trace (its last: COMPUTE_END)."""
        async with contextlib.aclosing(rest):  # type: ignore[type-var]
            async for response in rest:
                self._responded(None)
                yield response

    def _responded(self, future: asyncio.Future[Any] | None) -> None:
        if self.trace is not None and (future is None or not future.cancelled()):
            self.trace.responded()

    async def responses(
        self, wire: p.WireRequest, deadline_s: float | None = None
    ) -> AsyncIterator[p.WireResponse]:
        """``admit``, then every answer of the request in order (one when the handler does not
        stream); each answer's status is recorded as it passes. Leaving early (a closed
        generator) cancels the request, in the worker too."""
        item = self.admit(wire, deadline_s)
        first = await item.future
        self.status = first.status
        yield first
        async for response in self.rest(item):
            self.status = response.status
            yield response

    def answers_once(self, first: p.WireResponse, endpoint: str) -> None:
        """Check the first answer to an OIP request on an endpoint that answers once (REST
        infer, gRPC ModelInfer): a streamed part is Triton's refusal of a decoupled model there
        (501, its words after ``endpoint``); a handler that streamed nothing at all (a
        generator that yielded nothing: an empty final answer) gave no response (500)."""
        if first.partial:
            raise StreamNotSupported(
                f"{endpoint} doesn't support models with decoupled transaction policy: the "
                "model streams its answers (read them over gRPC ModelStreamInfer)"
            )
        if first.status == 200 and not first.body:
            raise HandlerFailed("The model gave no response")

    def leave(self) -> None:
        """The caller went away before its answer (an HTTP client that disconnected; a gRPC
        call's cancel reaches the futures through its task): the unanswered requests are
        cancelled, ``close`` takes them out of the queue and counts them, the record says 499."""
        self.status = CLIENT_LEFT
        for item in self.items:
            item.future.cancel()

    # -- the end --------------------------------------------------------------------------------

    def close(self) -> None:
        """Finish every admitted request (one left unanswered is cancelled, in its worker too)
        and record the exchange once: metrics, statistics, access line."""
        if self.closed:
            return
        self.closed = True
        release = self.wiring.release
        for names in self.held if release is not None else ():
            release(names)
        if self.cached is not None and self.status != 200:
            self.cached.withdraw()  # the protocol could not answer it (or its caller left)
        model = self.model
        for item in self.items:
            if model is not None:
                model.finish(item)
        waited = [i.dispatched - i.arrival for i in self.items if i.dispatched is not None]
        queue_s = max(waited) if waited else None
        seconds = time.perf_counter() - self.started
        ran = [i.payload for i in self.items if i.dispatched is not None]
        counted = 0
        if model is not None and self.status < 400:
            counted = inferences(model, ran, self._max_size())
        record = RequestRecord(
            self.scope, self.name, self.version, self.status, seconds, queue_s, model, counted
        )
        self.wiring.record(record)
        levels = model.queue.levels if model is not None else None
        if levels is not None and self.level is not None and self.level < len(levels):
            levels.answer(self.level, self.status)  # describe's and the metrics' per level
        if self.trace is not None:
            self._finish_trace(self.trace)

    def _finish_trace(self, trace: Trace) -> None:
        """The trace's times from the queue's clock (the same monotonic clock), then its file:
        a failure here is logged, never the request's."""
        try:
            trace.version = self.model.version if self.model is not None else self.version
            arrived = [i.arrival for i in self.items]
            taken = [i.dispatched for i in self.items if i.dispatched is not None]
            trace.queue_ns = int(min(arrived) * 1e9) if arrived else None
            trace.compute_ns = int(min(taken) * 1e9) if taken else None
            assert self.wiring.tracer is not None
            self.wiring.tracer.finish(trace)
        except Exception:
            log.exception("could not record the trace of a request to %s", self.name)


def _offer(lookup: Lookup) -> Callable[[asyncio.Future[p.WireResponse]], None]:
    """A miss's future callback: its first answer goes to the cache (stored when a whole 200)."""

    def offer(future: asyncio.Future[p.WireResponse]) -> None:
        failed = future.cancelled() or future.exception() is not None
        lookup.store(None if failed else future.result())

    return offer


def with_deadline(item: Item, deadline_s: float | None) -> None:
    """A just-queued ``item`` takes the caller's deadline (``deadline_s`` from now; None: none)
    when it is earlier than its own (``clientTimeoutInMills``). It is still queued (admission
    only appends), so the queue answers 504 and never runs it once the deadline has passed."""
    if deadline_s is not None:
        deadline = clock() + max(deadline_s, 0.0)
        item.deadline = deadline if item.deadline is None else min(item.deadline, deadline)


def status_of(exc: BaseException, current: int) -> int:
    """The status an exchange that ended with ``exc`` answered: the error tree's; 499 for a
    caller that left; a protocol error's own (``http_status``, gRPC); else ``current``."""
    if isinstance(exc, TorchbayError):
        return exc.status
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return CLIENT_LEFT if current == 500 else current
    status = getattr(exc, "http_status", None)
    return status if isinstance(status, int) else current
