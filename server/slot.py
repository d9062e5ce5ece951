"""One worker slot of a model version: a supervisor that starts the worker and restarts it with
back-off, and a dispatcher that pulls batches from the model's queue only while its worker is
READY (so a restarting worker never holds requests another worker could serve). A retiring slot
finishes the batch it holds and takes no more. Torch-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchbay.server import protocol as p
from torchbay.server.batching import Pending, reject
from torchbay.server.errors import TorchbayError
from torchbay.server.workers import WorkerLoadError, WorkerProcess, WorkerState

if TYPE_CHECKING:
    from torchbay.server.model import ModelVersion

log = logging.getLogger("torchbay.model")

# TorchServe's restart back-off (seconds), indexed by consecutive failures.
BACKOFF = (0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597)
# A worker that lived this long before dying resets the back-off.
HEALTHY_UPTIME_S = 10.0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one worker runs: a GPU id (None = CPU), its torch threads, optional core affinity."""

    gpu_id: int | None
    threads: int
    cpu_affinity: tuple[int, ...] | None = None


class WorkerSlot:
    """One place for a worker: a supervisor (start, restart with back-off) and a dispatcher."""

    def __init__(self, model: ModelVersion, index: int, placement: Placement) -> None:
        self.model = model
        self.index = index
        self.placement = placement
        self.worker: WorkerProcess | None = None
        self.load_error: WorkerLoadError | None = None
        self.retiring = False
        self.gave_up = False  # restarts exhausted the retry window
        self.restarts = 0
        self._ready = asyncio.Event()
        self._first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._supervisor: asyncio.Task | None = None
        self._dispatcher: asyncio.Task | None = None
        self._in_take = False
        self._running: list[Pending] = []

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.worker is not None and self.worker.alive

    @property
    def may_serve(self) -> bool:
        """Ready now, or expected to be after a restart."""
        return not self.retiring and not self.gave_up and (self.ready or self.worker is not None)

    def _load_message(self) -> p.Load:
        m = self.model
        return p.Load(
            model_dir=str(m.model_dir),
            model_name=m.name,
            model_version=m.version,
            batch_size=m.settings.batch_size,
            gpu_id=self.placement.gpu_id,
            handler=m.handler,
            num_threads=self.placement.threads,
            cpu_affinity=list(self.placement.cpu_affinity) if self.placement.cpu_affinity else None,
            server_version=m.server_version,
            limit_max_image_pixels=m.limit_max_image_pixels,
        )

    async def start(self) -> None:
        """Start the supervisor and dispatcher; return after the first load attempt."""
        self._supervisor = asyncio.ensure_future(self._supervise())
        self._dispatcher = asyncio.ensure_future(self._dispatch())
        await asyncio.shield(self._first)
        if self.load_error is not None and not self.ready:
            await self.retire()

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        window_start: float | None = None
        while not self.retiring:
            worker = WorkerProcess(
                self._load_message(), env=self.model.worker_env, log_format=self.model.log_format
            )
            self.worker = worker
            try:
                await worker.start(self.model.settings.startup_timeout_s, self.model.prewarmed())
            except WorkerLoadError as exc:
                self.load_error = exc
                log.error("model %s: worker failed to load: %s", self.model.key, exc)
                if not self._first.done():
                    self._first.set_result(None)
                    return  # a model that cannot load at all is reported, not retried
            else:
                self.load_error = None
                first = not self._first.done()
                if first:
                    self._first.set_result(None)
                else:
                    self.restarts += 1
                    self.model.restarts += 1
                self.model.observer.worker_started(self.model, worker, restart=not first)
                started = loop.time()
                self._ready.set()
                await worker.exited  # type: ignore[misc]
                self._ready.clear()
                if self.retiring or self.model.closing:
                    return
                if loop.time() - started >= HEALTHY_UPTIME_S:
                    failures, window_start = 0, None
            window_start = loop.time() if window_start is None else window_start
            if loop.time() - window_start > self.model.settings.max_retry_timeout_s:
                log.error("model %s: worker keeps failing; giving up", self.model.key)
                self.gave_up = True
                self.worker = None
                self.model.fail_if_unserved()
                return
            delay = BACKOFF[min(failures, len(BACKOFF) - 1)]
            failures += 1
            log.warning("model %s: restarting worker in %ss", self.model.key, delay)
            await asyncio.sleep(delay)

    async def _dispatch(self) -> None:
        queue = self.model.queue
        while not self.retiring:
            await self._ready.wait()
            if self.retiring:
                return
            self._in_take = True
            try:
                batch = await queue.take()
            finally:
                self._in_take = False
            worker = self.worker
            if self.retiring or worker is None or not worker.alive:
                queue.requeue_front(batch)  # its worker died meanwhile: let another run it
                continue
            self._running = batch
            try:
                await self.model.run_batch(worker, batch)
            finally:
                self._running = []

    def fail_running(self, exc: TorchbayError) -> None:
        for item in self._running:
            reject(item.future, type(exc)(exc.message))

    async def retire(self, timeout: float = 10.0) -> None:
        """Finish the batch in hand, take no more, stop the worker."""
        self.retiring = True
        self._ready.set()  # release a dispatcher waiting for readiness so it can exit
        dispatcher = self._dispatcher
        if dispatcher is not None and not dispatcher.done():
            if self._in_take or not self._running:
                dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dispatcher
        self._ready.clear()
        if self.worker is not None:
            await self.worker.stop(timeout)
        supervisor = self._supervisor
        if supervisor is not None and not supervisor.done():
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor

    @property
    def state(self) -> WorkerState:
        if self.worker is None:
            return WorkerState.FAILED if self.gave_up else WorkerState.STOPPED
        return self.worker.state
