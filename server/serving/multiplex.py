"""Many models per host: load a model version on its first request, unload the least recently
used idle one when the budget is full (``max_loaded_models``; Ray Serve's model multiplexing).

With a budget of N (> 0) every registered version is *on demand*. It stays registered (name,
config, archive unpacked in the work folder) whether it holds workers or not, and at most N
versions are *loaded* (hold workers, or are loading) at once. Unloaded is no new lifecycle: the
version holds zero slots (``ModelVersion.unload``) and loading adds them again
(``ModelVersion.load``, ``max(1, minWorkers)`` of them).

* Registration (start-up or the management API) loads a version with ``minWorkers`` > 0 while
  there is room, without evicting anything; the others (and every one past the budget) are
  registered unloaded, in registration order: start-up loads concurrently, so which of many
  start-up models fill the budget is not specified. An API registration that asks for workers
  while pinned versions fill the budget is refused 507 (it could never load): SageMaker's
  multi-model contract, whose platform then unloads models and tries again.
* A request that finds no worker (``admission.refuse``) calls ``ModelVersion.demand``: the
  first starts the load, the others share it; all are queued meanwhile, each bounded by its
  deadline (``clientTimeoutInMills`` or the caller's: the queue's timer, serving/deadlines.py,
  answers 504 at the deadline, and the load still completes). A load that fails answers every
  queued request with the load error (500 ``model_load_failed``; 507 when it ran out of
  memory); the next request tries again, after the worker restart back-off of the failures
  in a row (until then it is answered that error at once, and unloads nothing). A load
  undone as it runs (scaled to zero: its starting worker is stopped) leaves the queued to
  load it again.
* To make room, the least recently admitted (``ModelVersion.last_used``) loaded version that
  is idle (nothing queued, no reader in flight, no open sequence, not loading nor registering
  nor starting the workers of a scale)
  and not ``pinned`` is unloaded. It is idle, so unloading drains nothing; a request that
  arrives meanwhile is queued and loads it again. When every loaded version is busy, the load
  waits for one to become idle (re-checked every ``ROOM_POLL_S``); when every one is pinned, it
  fails 503 at once.
* Readiness: an on-demand version is READY (``ModelVersion.status``) loaded or not, as Ray
  Serve's multiplexed models are always routable: a load balancer that saw it unready would
  never send the request that loads it. Describe's ``loaded`` tells the two apart.

Off (budget 0, the default) none of this exists: ``minWorkers: 0`` is registered and answers 503
until scaled, as in TorchServe. Torch-free.
"""

from __future__ import annotations

import asyncio
import copy
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchbay.server.errors import InsufficientStorage, NoWorker, ShuttingDown, TorchbayError
from torchbay.server.serving.admission import stopping_message
from torchbay.server.serving.handle import WorkerLoadError
from torchbay.server.serving.queue import clock, reject
from torchbay.server.serving.sequences import SequenceQueue

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion

__all__ = ["Multiplexer", "Residency"]

# How often a load that waits for room looks again for an idle version to unload.
ROOM_POLL_S = 0.02


@dataclass(eq=False)
class Residency:
    """One version's loads and evictions, and its load under way (None: none), which takes
    a place of the budget once room is made for it (``placed``)."""

    loads: int = 0
    evictions: int = 0
    loading: asyncio.Future[None] | None = None
    failure: TorchbayError | None = None  # why its last load on demand failed (None: it did not)
    failed_loads: int = 0  # loads on demand that failed in a row (their workers could not load)
    retry_at: float = 0.0  # clock() before which a request does not load it again
    placed: bool = False  # also while a registration starts its workers: never evicted then
    leaving: asyncio.Future[None] | None = None  # its unload under way (an eviction)
    # One load or unload of this version at a time.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Multiplexer:
    """The budget of loaded model versions over ``versions`` (the registry's, all of them)."""

    def __init__(self, limit: int, versions: Callable[[], Iterable[ModelVersion]]) -> None:
        self.limit = limit
        self.versions = versions
        self._residency: weakref.WeakKeyDictionary[ModelVersion, Residency] = (
            weakref.WeakKeyDictionary()
        )
        self._room = asyncio.Lock()  # one load makes room at a time; loads then run in parallel

    def residency(self, mv: ModelVersion) -> Residency:
        found = self._residency.get(mv)
        if found is None:
            found = self._residency[mv] = Residency()
        return found

    @staticmethod
    def loaded(mv: ModelVersion) -> bool:
        """Holds a live slot (not retiring, not given up: a slot whose restarts were exhausted
        holds no worker, and the next request loads the version again)."""
        return any(not slot.retiring and not slot.gave_up for slot in mv.slots)

    def holds(self, mv: ModelVersion) -> bool:
        """Takes a place of the budget: loaded and not being unloaded, or loading with room
        made for it."""
        residency = self.residency(mv)
        return residency.placed or (residency.leaving is None and self.loaded(mv))

    def held(self) -> list[ModelVersion]:
        return [mv for mv in self.versions() if self.holds(mv)]

    # -- registration ---------------------------------------------------------------------------

    async def start(self, mv: ModelVersion, *, refuse_unloadable: bool = False) -> None:
        """A newly registered version: loaded with its ``minWorkers`` while there is room (never
        evicting for it), else registered unloaded; on demand from then on. Raises as
        ``ModelVersion.start`` (a version that cannot load is not registered).

        ``refuse_unloadable`` (a registration through the API): a version that asks for workers
        while pinned versions fill the budget could never load, as none of them may be unloaded
        for it, so it is refused with InsufficientStorage (507, SageMaker's "unload models and
        try again") instead of registered unloaded."""
        residency = self.residency(mv)
        mv.last_used = clock()  # registered now: the least recently used of those never asked
        # Decided at once, without ``_room``: a load holds that lock while it waits for a busy
        # version to go idle, which may take minutes, and a registration never waits for room.
        # Nothing awaits between a load's look at the budget and its place (or its evictions),
        # so this look sees every place taken: never past the budget.
        held = [other for other in self.held() if other is not mv]
        room = len(held) < self.limit
        never = not room and all(other.settings.pinned for other in held)
        if refuse_unloadable and never and mv.settings.min_workers > 0:
            raise InsufficientStorage(
                f'Model "{mv.name}" cannot be loaded: the {self.limit} loaded models '
                "allowed (max_loaded_models) are all pinned; unregister one first"
            )
        workers = mv.settings.min_workers if room else 0
        residency.placed = workers > 0
        try:
            residency.loads += workers > 0
            await mv.start(workers)
        finally:
            residency.placed = False
        mv.demand = self.demand

    # -- loading on demand ----------------------------------------------------------------------

    def demand(self, mv: ModelVersion) -> None:
        """A request found ``mv`` without a worker: start its load unless one is under way.
        After loads that failed in a row, the next waits its worker restart back-off
        (``restart_backoff_s``: at once after the first failure): until then a request is
        answered the last load's error at once, so a model that cannot load does not unload
        another model for every request it gets."""
        residency = self.residency(mv)
        held_off = residency.loading is None and clock() < residency.retry_at
        if held_off and residency.failure is not None:
            raise copy.copy(residency.failure)  # a fresh one: no traceback of before
        self._start(mv, residency)

    def _start(self, mv: ModelVersion, residency: Residency) -> None:
        if residency.loading is None:
            residency.loading = asyncio.ensure_future(self._load(mv, residency))

    async def load_now(self, mv: ModelVersion) -> None:
        """An operator's explicit load (Triton's repository load) of a version that is not
        loaded: loaded as its first request would load it (making room), answered once it is.
        Raises why it could not load (the load error, NoWorker when pinned versions fill the
        budget, ShuttingDown when it was unregistered meanwhile)."""
        residency = self.residency(mv)
        if self.loaded(mv) and residency.leaving is None:
            return
        self._start(mv, residency)  # the operator's call: never held off
        if residency.loading is not None:
            await asyncio.shield(residency.loading)
        if mv.closing:
            raise ShuttingDown(stopping_message(mv))
        if not self.loaded(mv):
            raise residency.failure or WorkerLoadError(mv.load_error or "it did not load")

    async def _load(self, mv: ModelVersion, residency: Residency) -> None:
        residency.failure = None
        try:
            async with self._room:
                leaving = await self._make_room(mv)
                residency.placed = True
            await asyncio.gather(*leaving)  # what they held is freed before this load spawns
            async with residency.lock:
                if self.loaded(mv) or mv.closing:
                    return  # loaded meanwhile (the management API scaled it), or unregistered
                residency.loads += 1
                errors = await mv.load(max(1, mv.settings.min_workers))
            if errors and not any(slot.may_serve for slot in mv.slots):
                residency.failed_loads += 1  # held off as a worker's restart: 0, 1, 1, 2.. s
                backoff = mv.settings.restart_backoff_s
                delay = backoff[min(residency.failed_loads, len(backoff)) - 1]
                residency.retry_at = clock() + delay
                raise _load_failed(mv, errors[0])
            residency.failed_loads, residency.retry_at = 0, 0.0
        except TorchbayError as exc:
            residency.failure = exc
            _answer_queued(mv, exc)
        finally:
            residency.loading, residency.placed = None, False
        if len(mv.queue) and not any(slot.may_serve for slot in mv.slots):
            self._start(mv, residency)  # unloaded as it loaded (scaled to zero): load it again

    async def _make_room(self, mv: ModelVersion) -> list[asyncio.Future[None]]:
        """Start unloading least recently used idle versions until ``mv`` fits the budget (the
        unloads, returned, run in parallel with other loads' decisions); wait while every
        candidate is busy. Raises NoWorker when pinned versions fill the budget."""
        leaving: list[asyncio.Future[None]] = []
        while not mv.closing:  # unregistered while it waits: no room is made for it
            held = [other for other in self.held() if other is not mv]
            if len(held) < self.limit:
                return leaving
            if all(other.settings.pinned for other in held):
                raise NoWorker(
                    f'Model "{mv.name}" cannot be loaded: the {self.limit} loaded models '
                    "allowed (max_loaded_models) are all pinned"
                )
            victim = self._victim(held)
            if victim is None:
                await asyncio.sleep(ROOM_POLL_S)  # every candidate is busy: wait for one
                continue
            leaving.append(self._evict(victim))
        return leaving

    def _victim(self, held: list[ModelVersion]) -> ModelVersion | None:
        """The least recently used of ``held`` that may be unloaded now (None: none may)."""
        idle = [mv for mv in held if self._evictable(mv)]
        return min(idle, key=lambda mv: mv.last_used) if idle else None

    def _evictable(self, mv: ModelVersion) -> bool:
        residency = self.residency(mv)
        return (
            not mv.settings.pinned
            and residency.loading is None
            and not residency.placed  # its registration's workers are starting
            and residency.leaving is None
            and not residency.lock.locked()
            # The operator's scale wins: a version whose new workers still load is not idle.
            and not any(slot.starting for slot in mv.slots)
            and not len(mv.queue)
            and not mv.inflight
            # A sequence's state lives in its worker: unloaded, its next request would be
            # refused as lost. It ends with its last request, its idle or its time limit.
            and not (isinstance(mv.queue, SequenceQueue) and mv.queue.open)
        )

    def _evict(self, mv: ModelVersion) -> asyncio.Future[None]:
        """Start unloading ``mv`` (idle): from now on it holds no place of the budget."""
        residency = self.residency(mv)
        residency.evictions += 1
        residency.failed_loads, residency.retry_at = 0, 0.0  # it was loaded (scaled up)
        residency.leaving = asyncio.ensure_future(self._unload(mv, residency))
        return residency.leaving

    async def _unload(self, mv: ModelVersion, residency: Residency) -> None:
        try:
            async with residency.lock:
                await mv.unload()
        finally:
            residency.leaving = None
        if len(mv.queue):  # admitted as it left (its slots not yet retiring): load it again
            self._start(mv, residency)

    # -- requests -------------------------------------------------------------------------------

    def describe(self, mv: ModelVersion) -> dict[str, Any]:
        """Describe's facts of one version: loaded or not, its loads and evictions, and when
        a request was last admitted (ISO 8601, UTC)."""
        residency = self.residency(mv)
        last = time.time() - (clock() - mv.last_used)
        return {
            "loaded": self.loaded(mv),
            "loads": residency.loads,
            "evictions": residency.evictions,
            "lastUsed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last)),
        }


def _load_failed(mv: ModelVersion, error: WorkerLoadError) -> TorchbayError:
    """What a failed load on demand answers: its error, or 507 when it ran out of memory (as
    a registration's load that runs out of memory: SageMaker's "unload models and retry")."""
    if not error.out_of_memory:
        return error
    return InsufficientStorage(
        f'Model "{mv.name}" could not be loaded: its worker ran out of memory ({error.error_type})'
    )


def _answer_queued(mv: ModelVersion, exc: TorchbayError) -> None:
    """Answer every request queued for ``mv`` with ``exc`` (its load failed) and admit again."""
    for item in mv.queue.close(exc):
        reject(item.future, exc)
    mv.queue.reopen()
