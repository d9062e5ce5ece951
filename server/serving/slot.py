"""One worker slot of a model version: a supervisor that starts the worker, restarts it with
back-off and recycles it, and a dispatcher that pulls batches from the model's queue only while
its worker is alive and READY (so a restarting worker never holds requests another worker could
serve). A retiring slot finishes the batch it holds and takes no more. Torch-free.

Supervision: a worker that fails to start at all on the slot's first attempt (its model does not
load) is reported, not retried. Afterwards every failure (the worker died, it failed to load
again, spawning it raised OSError such as EMFILE or ENOMEM) is retried after the server's
``restart_backoff_s`` delays, until a recovery has failed for ``max_retry_timeout_s``: then the
slot gives up (FAILED) and, when no slot can serve, everything queued is answered 503 at once.
As TorchServe's, a worker that loads again ends the recovery (its window starts again at the
next death); the delays start again once a worker served a batch or lived HEALTHY_UPTIME_S (one
that dies idle right after loading, a crash loop of its own, keeps backing off).

Recycling (``max_requests_per_worker``, ``max_worker_rss_mb``): make-before-break. After a
batch, a worker past a limit gets a replacement started beside it; the slot keeps serving with
the old worker until the replacement is READY, then switches and stops the old one once its
batch is done. No request is dropped or refused.

Calls go one way: a slot never calls its model version. What it needs (the queue, the live
settings, how to make a worker) comes in a ``SlotContext`` at construction, and what happens
(a batch done, a worker started, failed, recycled, the slot gave up) goes out through that
context's ``SlotEvents``, which the model version implements.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchbay.server.errors import HandlerFailed, TorchbayError
from torchbay.server.serving import protocol as p
from torchbay.server.serving.batches import BatchRecord, lost_metrics, run_batch
from torchbay.server.serving.continuous import Carry, ContinuousSequenceQueue
from torchbay.server.serving.handle import Spawned, WorkerLoadError, WorkerProcess, WorkerState
from torchbay.server.serving.launch import ModelSettings, Placement
from torchbay.server.serving.queue import BatchQueue, Pending, reject
from torchbay.server.serving.recycling import past_limit

log = logging.getLogger("torchbay.model")

# A worker that lived this long (or served a batch) before dying resets the back-off.
HEALTHY_UPTIME_S = 10.0
# After a replacement failed to start, the old worker serves on for this long before another try.
RECYCLE_RETRY_S = 5.0


__all__ = ["BatchRecord", "Placement", "SlotContext", "SlotEvents", "WorkerSlot", "run_batch"]


class SlotEvents:
    """What a slot reports upward; the default ignores it. The model version implements it."""

    def batch_done(self, record: BatchRecord) -> None:
        pass

    def worker_started(self, worker: WorkerProcess, restart: bool) -> None:
        pass

    def worker_start_failed(self, error: Exception) -> None:
        pass

    def worker_recycled(self, worker: WorkerProcess) -> None:
        pass

    def handler_metrics(self, records: list[dict], request_ids: str) -> None:
        """What the handler recorded in a batch its worker died in (batches.lost_metrics)."""

    def gave_up(self) -> None:
        """This slot's restarts were exhausted (it will never serve again)."""


@dataclass(frozen=True)
class SlotContext:
    """What every slot of one model version is handed at construction."""

    key: str  # "name/version", for logs
    queue: BatchQueue[p.WireRequest, p.WireResponse]
    settings: Callable[[], ModelSettings]  # the live settings (they change on scale/configure)
    new_worker: Callable[[Placement], WorkerProcess]  # from the model's LaunchSpec
    stopping: Callable[[], bool] = lambda: False  # the model is closing
    prewarmed: Callable[[], Spawned | None] = lambda: None
    events: SlotEvents = field(default_factory=SlotEvents)


class WorkerSlot:
    """One place for a worker: a supervisor (start, restart with back-off) and a dispatcher."""

    def __init__(self, ctx: SlotContext, index: int, placement: Placement) -> None:
        self.ctx = ctx
        self.index = index
        self.placement = placement
        self.worker: WorkerProcess | None = None
        self.load_error: WorkerLoadError | None = None
        self.retiring = False
        self.gave_up = False  # restarts exhausted the retry window
        self.restarts = 0
        self.start_failures = 0  # starts that raised (spawn OSError, load failure, timeout)
        self.recycles = 0
        self._ready = asyncio.Event()
        self._first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._recycle = asyncio.Event()  # the dispatcher asks the supervisor for a recycle
        self._recycle_hold_until = 0.0
        self._replacing = False  # a successor is being started
        self._idle = asyncio.Event()  # no batch in hand
        self._idle.set()
        self._supervisor: asyncio.Task | None = None
        self._dispatcher: asyncio.Task | None = None
        self._in_take = False
        self._running: list[Pending] = []
        # A continuous-batching sequence model's requests continued between calls.
        queue = ctx.queue
        self._carry = Carry(queue) if isinstance(queue, ContinuousSequenceQueue) else None

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.worker is not None and self.worker.alive

    @property
    def busy(self) -> bool:
        """A batch is in hand."""
        return not self._idle.is_set()

    @property
    def starting(self) -> bool:
        """The slot's first start is under way."""
        return not self._first.done()

    @property
    def may_serve(self) -> bool:
        """Ready now, or expected to be after a (re)start."""
        # (a ready slot has a worker: "ready or has a worker" is "has a worker")
        return not self.retiring and not self.gave_up and self.worker is not None

    def _new_worker(self) -> WorkerProcess:
        worker = self.ctx.new_worker(self.placement)
        if self.worker is not None:  # a handler that set its own threads sets them again
            worker.own_threads = self.worker.own_threads
        return worker

    async def start(self) -> None:
        """Start the supervisor and dispatcher; return after the first load attempt."""
        self._supervisor = asyncio.ensure_future(self._supervise())
        self._supervisor.add_done_callback(self._supervisor_done)
        self._dispatcher = asyncio.ensure_future(self._dispatch())
        await asyncio.shield(self._first)
        if self.load_error is not None and not self.ready:
            await self.retire()

    # -- supervision ----------------------------------------------------------------------------

    def _stopping(self) -> bool:
        return self.retiring or self.ctx.stopping()

    async def _boot(self, worker: WorkerProcess) -> bool:
        """Start ``worker``; False (logged, counted) when it could not start."""
        try:
            await worker.start(self.ctx.settings().startup_timeout_s, self.ctx.prewarmed())
        except WorkerLoadError as exc:
            self.load_error = exc
            log.error("model %s: worker failed to load: %s", self.ctx.key, exc)
        except Exception as exc:  # OSError from spawning (EMFILE, ENOMEM), a broken socket...
            self.load_error = WorkerLoadError(f"could not start a worker: {exc!r}")
            log.error("model %s: could not start a worker: %r", self.ctx.key, exc)
        else:
            self.load_error = None
            return True
        self.start_failures += 1
        self.ctx.events.worker_start_failed(self.load_error)
        return False

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        window_start: float | None = None
        while not self._stopping():
            first = not self._first.done()
            worker = self._new_worker()
            self.worker = worker
            if await self._boot(worker):
                if first:
                    self._first.set_result(None)
                else:
                    self.restarts += 1
                self.ctx.events.worker_started(worker, restart=not first)
                window_start = None  # recovered: only a recovery that fails is bounded
                proved = await self._watch(worker)
                if self._stopping():
                    return
                if proved:
                    failures = 0
            elif first:
                self._first.set_result(None)
                return  # a model that cannot load at all is reported, not retried
            window_start = loop.time() if window_start is None else window_start
            # At or past: a window of 0 gives up at the first failure on uvloop too, whose clock
            # stands still within a loop iteration (it retried once there; asyncio's moved on).
            if loop.time() - window_start >= self.ctx.settings().max_retry_timeout_s:
                log.error("model %s: worker keeps failing; giving up", self.ctx.key)
                self._give_up()
                return
            backoff = self.ctx.settings().restart_backoff_s
            delay = backoff[min(failures, len(backoff) - 1)]
            failures += 1
            log.warning("model %s: restarting worker in %gs", self.ctx.key, delay)
            await asyncio.sleep(delay)

    async def _watch(self, worker: WorkerProcess) -> bool:
        """Serve with ``worker`` (and its recycled successors) until one dies; whether that one
        proved itself (served a batch, or lived ``HEALTHY_UPTIME_S``)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._ready.set()
        while True:
            assert worker.exited is not None
            wanted = asyncio.ensure_future(self._recycle.wait())
            try:
                await asyncio.wait((worker.exited, wanted), return_when=asyncio.FIRST_COMPLETED)
            finally:
                wanted.cancel()
            if worker.exited.done():
                break
            self._replacing = True
            try:
                successor = await self._replace(worker)
            finally:
                self._replacing = False
                self._recycle.clear()  # asked again while replacing: that was this recycle
            if successor is not None:
                worker, started = successor, loop.time()
        self._ready.clear()
        return worker.batches > 0 or loop.time() - started >= HEALTHY_UPTIME_S

    async def _replace(self, old: WorkerProcess) -> WorkerProcess | None:
        """Make-before-break: start a successor beside ``old``, switch, stop ``old``."""
        new = self._new_worker()
        if not await self._boot(new):
            self._recycle_hold_until = asyncio.get_running_loop().time() + RECYCLE_RETRY_S
            log.warning("model %s: recycling %s failed; it serves on", self.ctx.key, old.name)
            return None
        self.worker = new  # the dispatcher's next batch goes to the new worker
        self._ready.set()
        self.recycles += 1
        self.ctx.events.worker_recycled(new)
        self.ctx.events.worker_started(new, restart=False)
        log.info(
            "model %s: recycled worker %s (pid %s) as %s (pid %s)",
            *(self.ctx.key, old.name, old.pid, new.name, new.pid),
        )
        await self._idle.wait()  # the old worker's batch, if any, is answered first
        await asyncio.shield(old.stop(self.ctx.settings().response_timeout_s or 10.0))
        return new

    def _give_up(self) -> None:
        self.gave_up = True
        self.worker = None
        self._ready.set()  # release the dispatcher: it sees gave_up and exits
        self.ctx.events.gave_up()

    def _supervisor_done(self, task: asyncio.Task) -> None:
        """Backstop: a supervisor that ended on an unexpected exception fails its slot loudly.
        One that ended before its first load (retired, or its model stopped, meanwhile: scaled
        down, unregistered) lets ``start`` return: nothing else would ever settle ``_first``."""
        if task.cancelled() or task.exception() is None:
            if not self._first.done():
                self._first.set_result(None)
            return
        log.error("model %s: worker supervisor crashed", self.ctx.key, exc_info=task.exception())
        if self.worker is not None:
            self.worker.kill()
        if not self._first.done():
            self.load_error = WorkerLoadError("the worker supervisor crashed")
            self._first.set_result(None)
        self._give_up()

    # -- dispatching ----------------------------------------------------------------------------

    async def _dispatch(self) -> None:
        queue = self.ctx.queue
        while not self.retiring and not self.gave_up:
            if not self.ready:
                self._ready.clear()  # its worker died or was killed: wait for the restart
                await self._ready.wait()
                continue
            self._in_take = True
            try:
                batch = await (self._carry.take(self) if self._carry else queue.take(self))
            finally:
                self._in_take = False
            worker = self.worker
            if self.retiring or worker is None or not worker.alive:
                queue.requeue_front(batch)  # its worker died meanwhile: let another run it
                continue
            self._running = batch
            self._idle.clear()
            try:
                run = self._carry.run if self._carry else run_batch
                record = await run(worker, batch, self.ctx.settings(), self.ctx.key)
            except Exception:  # a bug of ours; the batch is answered and the slot goes on
                self._broken_batch(worker, batch)
                record = None
            finally:
                self._running = []
                self._idle.set()
            if record is not None:
                self._report(self.ctx.events.batch_done, record)
            elif (lost := lost_metrics(worker, batch))[0]:
                self._report(self.ctx.events.handler_metrics, *lost)
            if worker is self.worker and self._wants_recycle(worker):
                self._recycle.set()

    def _report(self, event: Callable[..., None], *args: Any) -> None:
        """A batch's event (done, or its handler metrics when its worker died) to the model's
        metrics and autopilot. What they raise is a bug of ours, logged: the batch is answered
        already, and the slot must take the next one."""
        try:
            event(*args)
        except Exception:
            log.exception("model %s: recording a finished batch failed", self.ctx.key)

    def _broken_batch(self, worker: WorkerProcess, batch: list[Pending]) -> None:
        """A batch whose run raised what it never should (a bug of ours, logged): each request
        is answered 500, and the worker, whose channel may hold half a frame, is killed for
        the supervisor to replace. Without this the dispatcher ended: the batch was never
        answered and the slot never took another."""
        log.exception("model %s: running a batch on %s failed", self.ctx.key, worker.name)
        for item in batch:
            reject(item.future, HandlerFailed("Internal server error"))
        worker.kill()

    def _wants_recycle(self, worker: WorkerProcess) -> bool:
        if not worker.alive or self._recycle.is_set() or self._replacing:
            return False
        loop_time = asyncio.get_running_loop().time()
        if loop_time < self._recycle_hold_until:
            return False
        return past_limit(worker, self.ctx.settings(), self.ctx.key, loop_time)

    def fail_running(self, exc: TorchbayError) -> None:
        for item in self._running:
            reject(item.future, type(exc)(exc.message))

    async def retire(self, timeout: float = 10.0) -> None:
        """Finish the batch in hand, take no more, stop the worker. A batch whose requests are
        all answered already (a drain past its grace answered them 503) is not waited for:
        nobody wants its results, and a stuck or slow handler would hold the server's stop
        past Kubernetes' grace period (SIGKILL)."""
        self.retiring = True
        self._ready.set()  # release a dispatcher waiting for readiness so it can exit
        dispatcher = self._dispatcher
        busy = False  # its worker runs a batch nobody waits for: stopped without Shutdown
        if dispatcher is not None and not dispatcher.done():
            abandoned = all(item.future.done() for item in self._running)
            busy = abandoned and bool(self._running)
            if self._in_take or abandoned:  # abandoned: also true with no batch in hand
                dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dispatcher
        self._ready.clear()
        supervisor = self._supervisor
        if supervisor is not None and not supervisor.done():
            supervisor.cancel()  # a successor being started is killed by its own cleanup
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        if self.worker is not None:
            await self.worker.stop(timeout, busy=busy)

    @property
    def state(self) -> WorkerState:
        if self.worker is None:
            return WorkerState.FAILED if self.gave_up else WorkerState.STOPPED
        if self.retiring and self.worker.alive:
            return WorkerState.DRAINING  # it finishes its batch, if any, and stops
        return self.worker.state
