"""One served model version: its queue, its worker slots, and how requests flow through them.

A *slot* (serving/slot.py) owns one worker process at a time and pulls batches from the shared
queue while its worker is READY. Scaling adds or retires slots (a retiring slot finishes the
batch it holds) and re-tunes the survivors' CPU threads.

Every admitted request gets exactly one response: a result, a handler error, 504 (deadline or
response timeout), 503 (worker died, no worker, shutdown), 500 (over ``max_response_size``).

A version's status has one source, :meth:`ModelVersion.status`, computed from its slots; every
health and readiness answer (``/ping``, ``/v2/health/ready``, ``/v2/models/{m}/ready``, KServe
v1, describe, the ``torchbay_model_ready`` gauge) reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from torchbay.server.config.model_settings import SETTINGS
from torchbay.server.config.settings import ModelConfig
from torchbay.server.errors import NoWorker, ShuttingDown, TorchbayError
from torchbay.server.serving import protocol as p
from torchbay.server.serving.admission import Admission, stopping_message
from torchbay.server.serving.autopilot import Autopilot
from torchbay.server.serving.handle import (
    Spawned,
    SpawnFn,
    WorkerLoadError,
    WorkerProcess,
    spawn_process,
)
from torchbay.server.serving.launch import LaunchSpec, ModelSettings, Placement
from torchbay.server.serving.priority import levels_from
from torchbay.server.serving.queue import BatchQueue, reject
from torchbay.server.serving.queues import new_queue
from torchbay.server.serving.requests import RequestPath
from torchbay.server.serving.retiring import retire
from torchbay.server.serving.slot import BatchRecord, SlotContext, SlotEvents, WorkerSlot

__all__ = ["BatchRecord", "ModelSettings", "ModelStatus", "ModelVersion", "Observer"]

LIVE_SETTINGS = frozenset(name for name, s in SETTINGS.items() if s.live)  # what configure takes


class ModelStatus(enum.Enum):
    """LOADING: no live worker yet, one is starting (first start, or a restart under way).
    READY: at least one live worker. FAILED: no slot can ever serve (the model failed to load,
    or every worker's restarts gave up) until scaled up again. STOPPED: unregistered (from
    the start of its drain), or scaled to zero workers on request."""

    LOADING = "LOADING"
    READY = "READY"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


class Observer:
    """Hooks for metrics and logs; the default does nothing. Implemented by observe.metrics."""

    def batch_done(self, model: ModelVersion, record: BatchRecord) -> None:
        pass

    def worker_started(self, model: ModelVersion, worker: WorkerProcess, restart: bool) -> None:
        pass

    def worker_start_failed(self, model: ModelVersion, error: Exception) -> None:
        pass

    def worker_recycled(self, model: ModelVersion, worker: WorkerProcess) -> None:
        pass

    def handler_metrics(self, model: ModelVersion, records: list[dict], rids: str) -> None:
        pass


class _Events(SlotEvents):
    """How the slots' reports reach their model version (counters) and its observer."""

    def __init__(self, model: ModelVersion) -> None:
        self.model = model

    def batch_done(self, record: BatchRecord) -> None:
        if record.inference:  # a describe's batch is no service-rate nor latency sample
            self.model.admission.learn(record.size, record.run_s)
            self.model.autopilot.observe(record)  # sla_p99_ms: adapts the queue's batching
        self.model.observer.batch_done(self.model, record)

    def worker_started(self, worker: WorkerProcess, restart: bool) -> None:
        self.model.restarts += restart
        if restart:
            self.model.load_error = None  # it loads again
        self.model.observer.worker_started(self.model, worker, restart=restart)

    def worker_start_failed(self, error: Exception) -> None:
        self.model.start_failures += 1
        self.model.load_error = str(error)  # describe's loadError: why restarts fail (or failed)
        self.model.observer.worker_start_failed(self.model, error)

    def worker_recycled(self, worker: WorkerProcess) -> None:
        self.model.recycles += 1
        self.model.observer.worker_recycled(self.model, worker)

    def handler_metrics(self, records: list[dict], request_ids: str) -> None:
        self.model.observer.handler_metrics(self.model, records, request_ids)

    def gave_up(self) -> None:
        self.model.fail_if_unserved()


class ModelVersion(RequestPath):
    """A loaded archive served by a pool of worker processes."""

    autopilot = cached_property(Autopilot)  # adapts batching to sla_p99_ms; inert without it
    # Requests whose caller left before their answer, by where they were (``finish``).
    cancelled = cached_property(lambda _: {"queued": 0, "running": 0})
    # max_loaded_models (serving/multiplex.py): the last admission's clock() (least recently
    # used first), and, called when a request finds no worker, a load instead of the 503.
    last_used = 0.0
    demand: Callable[[ModelVersion], None] | None = None
    # The register API's ``runtime`` (TorchServe's RuntimeType); None: the manifest's.
    runtime: str | None = None
    # Being unregistered (set before its drain): gone for the management API, as TorchServe
    # takes a version out of its map before draining it.
    leaving = False

    def __init__(
        self,
        *,
        name: str,
        version: str,
        model_dir: Path,
        settings: ModelSettings,
        config: ModelConfig | None = None,
        place: Callable[[ModelVersion, int], Placement],
        retune: Callable[[], object] | None = None,
        launch: LaunchSpec | None = None,
        url: str = "",
        manifest: Any = None,
        observer: Observer | None = None,
        prewarmed: Callable[[], Spawned | None] | None = None,
        spawn: SpawnFn | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.model_dir = model_dir
        self.source: tuple[int, int] | None = None  # its archive file's store.identity
        # The resolved ModelConfig is the source; ``settings`` is its live view (settings_from).
        self.config = config
        self.settings = settings
        self.url = url
        self.manifest = manifest
        # The one description of this version's workers; each slot places its own copy.
        self.launch = launch or LaunchSpec(model_dir, name, version)
        self.observer = observer or Observer()
        self._place = place
        self._retune_host = retune  # re-shares the host's CPU threads (serving/budget.py)
        self.prewarmed: Callable[[], Spawned | None] = prewarmed or (lambda: None)
        self.spawn: SpawnFn = spawn or spawn_process  # the seam tests use to fail spawning
        self._final: ModelStatus | None = None  # FAILED (never loaded) or STOPPED (unloaded)
        self._loading = True  # until start() has made its first attempt
        self.load_error: str | None = None
        self.queue: BatchQueue[p.WireRequest, p.WireResponse] = new_queue(
            settings, levels_from(config, name)
        )
        self.admission = Admission(self.queue, settings.max_queue_delay_ms)  # max_queue_delay_ms
        self.slots: list[WorkerSlot] = []
        self._slot_context = SlotContext(
            key=self.key,
            queue=self.queue,
            settings=lambda: self.settings,
            new_worker=self._new_worker,
            stopping=lambda: self.closing,
            prewarmed=lambda: self.prewarmed(),
            events=_Events(self),
        )
        self._slot_index = 0
        self.inflight = 0
        self.restarts = 0
        self.start_failures = 0
        self.recycles = 0
        # Counted for the management API's describe (TorchServe's ``metrics`` object).
        self.requests_received = 0
        self.requests_rejected = 0
        self.closing = False

    # -- lifecycle ----------------------------------------------------------------------------

    def _new_worker(self, placement: Placement) -> WorkerProcess:
        """A worker for a slot at ``placement``, from this version's launch spec (read at call
        time: tests swap ``spawn``, ``configure`` changes the batch size)."""
        return self.launch.placed(placement, self.settings.batch_size).new_worker(self.spawn)

    @property
    def key(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def status(self) -> ModelStatus:
        """The one answer to "can this version serve?" (see ModelStatus)."""
        if self._final is not None:
            return self._final
        if self.leaving:  # being unregistered: it takes no request any more
            return ModelStatus.STOPPED
        slots = [s for s in self.slots if not s.retiring]
        if any(s.ready for s in slots) or self.demand is not None:
            return ModelStatus.READY  # on demand: routable unloaded, a request loads it
        if self._loading or any(s.may_serve or s.starting for s in slots):
            return ModelStatus.LOADING
        if not slots and self.settings.min_workers == 0:
            return ModelStatus.STOPPED  # scaled to zero on request
        return ModelStatus.FAILED

    @property
    def healthy(self) -> bool:
        """TorchServe's /ping: serving, or holding zero workers on request."""
        status = self.status
        return status is ModelStatus.READY or (status is ModelStatus.STOPPED and not self._final)

    async def start(self, workers: int | None = None, keep: bool = False) -> None:
        """Start ``workers`` (default min_workers) and wait for their first load.

        Raises WorkerLoadError when every worker fails to load (the model is FAILED: stopped, or
        with ``keep`` open, until scaled). With zero workers it answers 503 until scaled.
        """
        count = self.settings.min_workers if workers is None else workers
        try:
            errors = await self._add_slots(count)
        finally:
            self._loading = False
        if count and not any(slot.ready for slot in self.slots):
            if self.closing and not errors:  # unregistered (or the server stopped) meanwhile
                raise ShuttingDown(
                    stopping_message(self, "was stopped", " before its workers loaded")
                )
            if not errors and self.settings.min_workers == 0:
                return  # scaled to zero meanwhile: registered with no worker, as TorchServe
            error = errors[0] if errors else WorkerLoadError("no worker could load the model")
            self.load_error = str(error)
            if not keep:
                await self.stop(timeout=5)
                self._final = ModelStatus.FAILED
            raise error

    async def _add_slots(self, count: int) -> list[WorkerLoadError]:
        """Start ``count`` new slots; drop (and return the errors of) those that cannot load.
        None once the version is closing: an unregister met a scale (its slots are stopped)."""
        if self.closing:
            return []
        new = []
        for _ in range(count):
            index = self._slot_index
            slot = WorkerSlot(self._slot_context, index, self._place(self, index))
            self._slot_index += 1
            new.append(slot)
            self.slots.append(slot)
        await asyncio.gather(*(slot.start() for slot in new))
        errors = []
        for slot in new:
            if slot.load_error is not None and not slot.ready:
                errors.append(slot.load_error)
                if slot in self.slots:  # an unregister meanwhile cleared them
                    self.slots.remove(slot)
        if errors:
            self.load_error = str(errors[0])
        elif new:
            self.load_error = None  # it loads again
        return errors

    async def scale(
        self,
        min_workers: int,
        max_workers: int | None = None,
        resized: Callable[[], object] = lambda: None,
    ) -> None:
        """Grow or shrink to ``min_workers`` live slots. Shrinking drains, never drops: it
        returns once the idle workers stopped, those running a batch finish it meanwhile.
        ``resized`` is called once the new counts are the version's settings, before any
        worker starts or stops (a config snapshot, as TorchServe writes it then)."""
        max_workers = min_workers if max_workers is None else max_workers
        self._update(min_workers=min_workers, max_workers=max_workers)
        resized()
        await self._drop_given_up()  # replaced by new slots below
        live = [s for s in self.slots if not s.retiring]
        if min_workers > len(live):
            await self._add_slots(min_workers - len(live))
        elif min_workers < len(live):
            await retire(self.slots, live[min_workers:], busy_later=True)
            self.fail_if_unserved(scaled=True)
        self._retune()

    async def load(self, workers: int) -> list[WorkerLoadError]:
        """Start ``workers`` more slots and wait for their first load (serving/multiplex.py's
        load on demand); the errors of those that could not load (they are dropped). Slots
        that gave up (their restarts exhausted) are dropped first: the new ones replace them."""
        await self._drop_given_up()
        errors = await self._add_slots(workers)
        self._retune()
        return errors

    async def _drop_given_up(self) -> None:
        """Drop (and retire) the slots whose restarts were exhausted."""
        gone = [s for s in self.slots if s.gave_up]
        for slot in gone:
            self.slots.remove(slot)
        await asyncio.gather(*(slot.retire() for slot in gone))

    async def unload(self) -> None:
        """Retire every slot (each finishes the batch it holds) and keep the version registered
        with its settings: serving/multiplex.py's eviction, which ``load`` undoes."""
        await retire(self.slots, list(self.slots))
        self._retune()

    def _retune(self) -> None:
        """After scaling, every worker of every model takes its share of the host again."""
        if self._retune_host is not None:
            self._retune_host()

    def _update(self, **changes: Any) -> None:
        """A live change: a new ModelConfig validated through the same model (refused changes
        raise ValidationError before anything changes), and the settings that derive from it."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if self.config is not None:
            self.config = ModelConfig.model_validate({**self.config.model_dump(), **changes})
        self.settings = self.settings.updated(**changes)

    def fail_if_unserved(self, scaled: bool = False) -> None:
        """When no slot can ever serve again, answer everything queued with 503 at once; or,
        ``scaled`` to zero on demand (serving/multiplex.py), load it again for them."""
        if any(s.may_serve for s in self.slots):
            return
        if scaled and self.demand is not None and len(self.queue):
            with contextlib.suppress(TorchbayError):  # held off after failed loads: a 503
                self.demand(self)
                return
        message = f'Model "{self.name}" version {self.version} has no worker left'
        for item in list(self.queue.close(NoWorker(message))):
            reject(item.future, NoWorker(message))
        self.queue.reopen()

    def configure(self, **changes: Any) -> None:
        """Change the live settings (those declared ``live`` in ``config.model_settings``:
        batching, timeouts, the queue-time bound, the autopilot's target; None: unchanged)."""
        unknown = sorted(set(changes) - LIVE_SETTINGS)
        if unknown:
            raise TypeError(f"not live settings: {', '.join(unknown)}")
        self._update(**changes)
        self.admission.configure(changes.get("max_queue_delay_ms"))  # None: unchanged
        if changes.get("sla_p99_ms") is not None:
            self.autopilot.retargeted()  # 0: off, the configured batching back at once
        delay_ms = changes.get("max_batch_delay_ms")
        self.queue.configure(
            batch_size=changes.get("batch_size"),
            max_delay_s=None if delay_ms is None else delay_ms / 1000,
        )

    async def drain(self, timeout: float, hurry: asyncio.Event | None = None) -> bool:
        """Stop admitting; wait up to ``timeout`` (or until ``hurry`` is set) for queued and
        running requests to finish.

        Whatever is left afterwards is answered 503 ShuttingDown. Returns True if all finished.
        """
        self.closing = True
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while (len(self.queue) or self.inflight) and loop.time() < end:
            if not any(s.ready for s in self.slots) or (hurry is not None and hurry.is_set()):
                break  # nobody will ever run them, or the operator will not wait
            await asyncio.sleep(0.02)
        clean = not len(self.queue) and not self.inflight
        exc = ShuttingDown(stopping_message(self))
        for item in self.queue.close(exc):
            reject(item.future, ShuttingDown(exc.message))
        for slot in self.slots:
            slot.fail_running(exc)
        return clean

    async def stop_starting(self) -> None:
        """Retire the slots whose first start is still under way (the server stops: whatever
        waits for them, a registration or a scale, is answered now, not past the grace)."""
        await asyncio.gather(*(slot.retire() for slot in self.slots if slot.starting))

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop every worker (after ``drain`` for a graceful stop)."""
        self.closing = True
        for item in self.queue.close(ShuttingDown("The model is being unloaded")):
            reject(item.future, ShuttingDown("The model is being unloaded"))
        await asyncio.gather(*(slot.retire(timeout) for slot in list(self.slots)))
        self.slots.clear()
        if self._final is None:
            self._final = ModelStatus.STOPPED

    @property
    def ready_workers(self) -> int:
        return sum(1 for s in self.slots if s.ready)
