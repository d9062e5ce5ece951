"""Per-model-version inference statistics in the shape of Triton's statistics extension
(``GET /v2/models[/{m}[/versions/{v}]]/stats``).

Fed by what already flows, registered from outside (``http/apps.py``): every answered inference
request (the listeners' ``RequestRecord``) and every executed batch (the slots' ``BatchRecord``,
through the registry's observer). Nothing in ``serving`` calls this module.

What each field counts (Triton's meanings, on torchbay's parts):

* ``success`` / ``fail``: answered requests routed to the version, status < 400 / >= 400
  (rejected at admission, timed out, handler errors), with their total time;
* ``queue``: successful requests, with their time in the version's queue, cache hits among
  them (Triton's ``queue`` includes them: counted, with no queue time); a failed request,
  wherever it failed, is in ``fail`` alone (Triton's ``UpdateFailure`` counts no queue);
* ``compute_input`` / ``compute_infer`` / ``compute_output``: the handler's ``preprocess`` /
  ``inference`` (or the whole ``handler`` time when it reports no stages) / ``postprocess``
  time of each batch, charged to every successful request of the batch (as Triton does: a
  failed request has no compute time; ``batch_stats`` counts the execution all the same);
* ``cache_hit`` / ``cache_miss``: response cache look-ups (``plane/cache.py``) that hit, with
  their digest and look-up time, and that missed, with that and the insertion time; a hit is
  also one ``success`` and one ``queue`` (no time), with no compute, execution or inference;
* ``inference_count``: the inferences of the successful requests a worker ran, where, as
  Triton counts, an OIP request to a model that batches is its batch dimension's (its first
  input's first dimension) and any other request one (a cache hit is none, as Triton's count
  leaves hits out);
  ``execution_count``: batches executed (a batch whose every request the worker refused
  before the handler ran, for its input or its shared-memory region, is none: Triton refuses
  those before the model); ``batch_stats``: per batch size
  (the requests the handler ran, not those it refused before), the executions and their
  stage times; ``last_inference``: ms since the epoch.

Statistics live as long as the version: a version loaded again starts from zero. Torch-free.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchbay.server.observe.logs import RequestHook, RequestRecord
from torchbay.server.serving.model import Observer

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion
    from torchbay.server.serving.slot import BatchRecord

# Triton stat -> the worker's stage timing (ms) that feeds it, in order of preference.
STAGE_SOURCES = {
    "compute_input": ("preprocess",),
    "compute_infer": ("inference", "handler"),
    "compute_output": ("postprocess",),
}
MAX_BATCH_SIZES = 1024  # distinct batch sizes kept (batch sizes are bounded by settings anyway)


@dataclass
class Duration:
    """Triton's ``$duration_stat``."""

    count: int = 0
    ns: int = 0

    def add(self, count: int, ns: int) -> None:
        self.count += count
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


def _durations() -> dict[str, Duration]:
    return {name: Duration() for name in STAGE_SOURCES}


@dataclass
class VersionStats:
    """The statistics of one model version."""

    last_inference: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute: dict[str, Duration] = field(default_factory=_durations)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    batches: dict[int, dict[str, Duration]] = field(default_factory=dict)

    def to_json(self, name: str, version: str) -> dict[str, Any]:
        inference_stats = {
            "success": self.success.to_json(),
            "fail": self.fail.to_json(),
            "queue": self.queue.to_json(),
            **{stage: d.to_json() for stage, d in self.compute.items()},
            "cache_hit": self.cache_hit.to_json(),
            "cache_miss": self.cache_miss.to_json(),
        }
        batch_stats = [
            {"batch_size": size, **{stage: d.to_json() for stage, d in stages.items()}}
            for size, stages in sorted(self.batches.items())
        ]
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": inference_stats,
            "response_stats": {},
            "batch_stats": batch_stats,
            "memory_usage": [],
        }


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


class OipStats(Observer):
    """The accumulator: ``request_done`` is a RequestHook, ``batch_done`` an observer hook."""

    def __init__(self) -> None:
        self._stats: weakref.WeakKeyDictionary[ModelVersion, VersionStats] = (
            weakref.WeakKeyDictionary()
        )

    def of(self, mv: ModelVersion) -> VersionStats:
        stats = self._stats.get(mv)
        if stats is None:
            stats = self._stats[mv] = VersionStats()
        return stats

    def request_done(self, request: RequestRecord) -> None:
        if request.model is None:
            return  # not routed to a version: nothing to charge it to
        stats = self.of(request.model)
        if request.status < 400:
            stats.success.add(1, _ns(request.seconds))
            if request.queue_s is not None:  # a worker ran it: not a cache hit
                stats.inference_count += request.inferences
            stats.last_inference = int(time.time() * 1000)
            # Triton's queue counts successes (a cache hit, which no worker took, with no
            # time: its wait before the look-up is none here); a failure is in fail alone
            stats.queue.add(1, _ns(request.queue_s or 0.0))
        else:
            stats.fail.add(1, _ns(request.seconds))

    def cache_done(self, model: ModelVersion, hit: bool, seconds: float) -> None:
        """One response cache look-up of ``model``: a hit, or a miss (once its answer came)."""
        stats = self.of(model)
        (stats.cache_hit if hit else stats.cache_miss).add(1, _ns(seconds))

    def batch_done(self, model: ModelVersion, record: BatchRecord) -> None:
        if not record.inference:  # a management describe's: no execution of Triton's
            return
        if "handler" not in record.timings_ms:
            return  # every request was refused before the handler (its input, its region)
        stats = self.of(model)
        stats.execution_count += 1
        charged = record.size if record.succeeded is None else record.succeeded
        size = record.size if record.executed is None else record.executed
        per_batch = stats.batches.get(size)
        if per_batch is None and len(stats.batches) < MAX_BATCH_SIZES:
            per_batch = stats.batches[size] = _durations()
        for stat, sources in STAGE_SOURCES.items():
            ms = next((record.timings_ms[s] for s in sources if s in record.timings_ms), None)
            if ms is None:
                continue
            ns = _ns(ms / 1000)
            stats.compute[stat].add(charged, ns * charged)
            if per_batch is not None:
                per_batch[stat].add(1, ns)

    def model_stats(self, versions: Iterable[ModelVersion]) -> dict[str, Any]:
        """``{"model_stats": [...]}`` for ``versions`` (zeros for one never used)."""
        return {
            "model_stats": [
                (self._stats.get(mv) or VersionStats()).to_json(mv.name, mv.version)
                for mv in versions
            ]
        }


class Observers(Observer):
    """Several observers as one (the registry takes one): each hook goes to each, in order."""

    def __init__(self, *observers: Observer) -> None:
        self.observers = observers

    def batch_done(self, model: ModelVersion, record: BatchRecord) -> None:
        for o in self.observers:
            o.batch_done(model, record)

    def worker_started(self, model: ModelVersion, worker: Any, restart: bool) -> None:
        for o in self.observers:
            o.worker_started(model, worker, restart)

    def worker_start_failed(self, model: ModelVersion, error: Exception) -> None:
        for o in self.observers:
            o.worker_start_failed(model, error)

    def worker_recycled(self, model: ModelVersion, worker: Any) -> None:
        for o in self.observers:
            o.worker_recycled(model, worker)

    def handler_metrics(self, model: ModelVersion, records: list[dict], rids: str) -> None:
        for o in self.observers:
            o.handler_metrics(model, records, rids)


def chain(*hooks: RequestHook | None) -> RequestHook:
    """One RequestHook calling each of ``hooks`` in order."""
    present = [h for h in hooks if h is not None]

    def on_request(request: RequestRecord) -> None:
        for hook in present:
            hook(request)

    return on_request
