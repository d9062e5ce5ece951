"""Prometheus metrics: one CollectorRegistry owned by the server, fed from the frontend only.

Workers never touch Prometheus: their stage timings and custom metrics ride back in each
``Result`` and are recorded here, on the event loop. Torch-free.

Per model version (labels ``model``, ``version``)::

    torchbay_requests_total{code}            every request routed to the model, by status code
    torchbay_request_latency_seconds         histogram, end to end (queue included)
    torchbay_queue_latency_seconds           histogram, admission -> a worker took it
    torchbay_handler_seconds{stage}          histogram per batch: preprocess, inference,
                                             postprocess, handler (the whole handle call)
    torchbay_batch_size                      histogram of requests per batch
    torchbay_worker_restarts_total           restarts after a worker died
    torchbay_worker_start_failures_total     worker starts that failed (spawn OSError, load
                                             failure, start-up timeout)
    torchbay_worker_recycles_total           workers replaced on max_requests_per_worker or
                                             max_worker_rss_mb
    torchbay_model_load_seconds              load time of the most recently started worker
    torchbay_queue_depth, torchbay_inflight_requests, torchbay_workers{state},
    torchbay_model_ready                     read at scrape time from the model registry
                                             (1 when ModelVersion.status is READY)
    torchbay_admission_rejections_total{reason}  503s of the queue-time bound and the queue
                                             (predicted_wait, expired, queue_full; admission.py)

    torchbay_unrouted_requests_total{code}   requests that reached no model (unknown model or
                                             version: 404; refused before routing: 401/403)
    torchbay_cache_*                         the response cache's hits, misses and size
                                             (observe.cache_metrics, ``self.cache``)

The latency and queue histograms count the requests a worker took (answered by the handler, or
lost with a dying worker); requests refused at admission (503 queue full or no worker, 504
expired in the queue) count only in ``torchbay_requests_total``, so overload never drags the
latency percentiles down with instant rejections.

TorchServe's frontend series, written as TorchServe 0.12 writes them in Prometheus mode (names,
types, label order; tests/data/torchserve_0.12 holds its record) so existing dashboards and alerts
keep working: counters ``ts_inference_requests_total``, ``ts_inference_latency_microseconds`` and
``ts_queue_latency_microseconds`` (``model_name``, ``model_version``, ``hostname``; the version is
``"default"`` when the URL named none; requests routed to a model, refused ones included),
counters ``Requests2XX/4XX/5XX`` (``Level``, ``Hostname``: every answer of the inference and
management listeners, ``counting``), gauges ``QueueTime`` and ``WorkerThreadTime`` (last request,
ms), ``WorkerLoadTime`` (``WorkerName``, ``Level``, ``Hostname``; per live worker, ms) and
``PredictionTime`` (``ModelName``, ``Level``, ``Hostname``; the last batch's handler time, ms).
prometheus_client cannot write a counter whose sample has no ``_total`` nor keep label order, so
observe.ts_metrics writes them (``ts_text``) and serves them after the registry's text
(``metrics_app``), always as text format 0.0.4 (TorchServe serves no OpenMetrics), uncompressed.
Host and GPU metrics: observe.system_metrics. Custom handler metrics: observe.custom_metrics.
Cancelled requests (``torchbay_cancelled_requests_total{stage}``): observe.cancel_metrics.
Loaded models, loads and evictions (``max_loaded_models``): observe.multiplex_metrics.

The hot path only bumps floats and cached labelled children; everything that describes state
(queue depth, in-flight, workers) is read when scraped, by a collector.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from torchbay.server.observe.autopilot_metrics import AutopilotCollector
from torchbay.server.observe.cache_metrics import CacheMetrics
from torchbay.server.observe.cancel_metrics import CancelCollector
from torchbay.server.observe.custom_metrics import LABELS, CustomMetrics
from torchbay.server.observe.logs import RequestRecord
from torchbay.server.observe.model_state_metrics import ModelStateCollector
from torchbay.server.observe.multiplex_metrics import MultiplexCollector
from torchbay.server.observe.system_metrics import GpuCollector, HostCollector, load_nvml
from torchbay.server.serving.handle import WorkerProcess
from torchbay.server.serving.model import ModelVersion, Observer
from torchbay.server.serving.slot import BatchRecord

if TYPE_CHECKING:
    from torchbay.server.serving.registry import ModelRegistry

log = logging.getLogger("torchbay.metrics")

# No ``*_created`` series: one extra gauge per labelled counter/histogram that TorchServe never
# had and dashboards never use. prometheus_client's switch is process-wide; this process is
# the server.
disable_created_metrics()

# Latency buckets (seconds): sub-millisecond overhead-bound models up to slow ones.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STAGES = frozenset(("preprocess", "inference", "postprocess", "handler"))
TS_LABELS = ("model_name", "model_version", "hostname")


class _Series:
    """The labelled children of one model version, cached so a request does no label lookups."""

    __slots__ = ("batch", "codes", "latency", "queue", "stages", "ts_default", "ts_named")

    def __init__(self, metrics: ServerMetrics, mv: ModelVersion) -> None:
        name, version = mv.name, mv.version
        self.latency = metrics.latency.labels(name, version)
        self.queue = metrics.queue_time.labels(name, version)
        self.batch = metrics.batch_size.labels(name, version)
        self.codes: dict[int, Any] = {}
        self.stages: dict[str, Any] = {}
        # TorchServe accumulators [requests, latency us, queue us], shared by every ModelVersion
        # object with the same labels (a model unloaded and loaded again continues its series).
        self.ts_default = metrics.ts_totals.setdefault((name, "default"), [0.0, 0.0, 0.0])
        self.ts_named = metrics.ts_totals.setdefault((name, version), [0.0, 0.0, 0.0])


class ServerMetrics(Observer):
    """Everything the server exports, on one registry. See the module docstring for the names.

    ``system_metrics=False`` (config ``disable_system_metrics``) leaves out host and GPU series;
    ``nvml`` overrides NVML discovery (None: no GPU series). Call :meth:`watch` once the model
    registry exists, and :meth:`close` at shutdown.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        hostname: str | None = None,
        system_metrics: bool = True,
        nvml: Any = "auto",
        max_custom_metrics: int = 100,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.hostname = hostname or socket.gethostname()
        self.models: ModelRegistry | None = None
        self._declare(self.registry)
        self._series: dict[ModelVersion, _Series] = {}
        self._unrouted: dict[int, Any] = {}
        # TorchServe's series (observe.ts_metrics writes them): (model, version) -> [requests,
        # latency us, queue us]; Requests{2,4,5}XX by status // 100.
        self.ts_totals: dict[tuple[str, str], list[float]] = {}
        self.status_counts = [0.0] * 6
        self.prediction_ms: dict[str, float] = {}  # model name -> last batch's handler time
        self._last_total_s: float | None = None
        self._last_queue_s = 0.0
        self._last_handler_ms = 0.0
        self.custom = CustomMetrics(self.registry, max_metrics=max_custom_metrics)
        self.cache = CacheMetrics(self.registry)  # the response cache's (plane/cache.py)
        self.registry.register(ModelStateCollector(self))
        self.registry.register(MultiplexCollector(self))  # max_loaded_models (serving/multiplex)
        for collector in (AutopilotCollector, CancelCollector):  # they read self.versions()
            self.registry.register(collector(self.versions))
        self._gpu: GpuCollector | None = None
        if system_metrics:
            self.registry.register(HostCollector(self.hostname))
            self._register_gpu(load_nvml() if nvml == "auto" else nvml)

    def _declare(self, r: CollectorRegistry) -> None:
        """The per-model-version series (labels ``model``, ``version``)."""
        self.requests = Counter(
            "torchbay_requests", "Inference requests by status code", (*LABELS, "code"), registry=r
        )
        self.unrouted = Counter(
            "torchbay_unrouted_requests",
            "Inference requests that reached no model (unknown model or version, refused auth)",
            ("code",),
            registry=r,
        )
        self.latency = Histogram(
            "torchbay_request_latency_seconds",
            "End-to-end latency in the frontend, queue included",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "torchbay_queue_latency_seconds",
            "Time a request waited in its model's queue before a worker took it",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "torchbay_batch_size", "Requests per batch", LABELS, buckets=BATCH_BUCKETS, registry=r
        )
        self.handler_time = Histogram(
            "torchbay_handler_seconds",
            "Handler time per batch by stage (preprocess, inference, postprocess, handler)",
            (*LABELS, "stage"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.worker_restarts = Counter(
            "torchbay_worker_restarts", "Worker processes restarted", LABELS, registry=r
        )
        self.start_failures = Counter(
            "torchbay_worker_start_failures",
            "Worker starts that failed (spawn error, load failure, start-up timeout)",
            LABELS,
            registry=r,
        )
        self.recycles = Counter(
            "torchbay_worker_recycles",
            "Workers replaced after max_requests_per_worker or max_worker_rss_mb",
            LABELS,
            registry=r,
        )
        self.load_time = Gauge(
            "torchbay_model_load_seconds",
            "Load time of the most recently started worker",
            LABELS,
            registry=r,
        )

    def _register_gpu(self, nvml: Any) -> None:
        if nvml is None:
            return
        gpu = GpuCollector(self.hostname, nvml)
        if gpu.device_count:
            self.registry.register(gpu)
            self._gpu = gpu
        else:
            gpu.close()

    def watch(self, models: ModelRegistry) -> None:
        """Read queue depth, in-flight requests and worker states from ``models`` when scraped."""
        self.models = models

    def versions(self) -> list[ModelVersion]:
        """Every model version of the registry watched (none before ``watch``)."""
        return list(self.models.all_versions()) if self.models is not None else []

    def close(self) -> None:
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None

    def _new_series(self, mv: ModelVersion) -> _Series:
        series = self._series[mv] = _Series(self, mv)
        return series

    def count_response(self, status: int) -> None:
        """One answer of the inference or management listener (Requests2XX/4XX/5XX)."""
        cls = status // 100
        if 2 <= cls <= 5:
            self.status_counts[cls] += 1

    def last_times_ms(self) -> tuple[float, float] | None:
        """TorchServe's QueueTime and WorkerThreadTime of the last request a worker took (ms):
        its queue time, and its time outside the queue and the handler."""
        if self._last_total_s is None:
            return None
        outside = (self._last_total_s - self._last_queue_s) * 1000 - self._last_handler_ms
        return self._last_queue_s * 1000, max(0.0, outside)

    def worker_load_times_ms(self) -> list[tuple[str, float]]:
        """(worker name, load time ms) of every live worker (TorchServe's WorkerLoadTime)."""
        return [
            (slot.worker.name, slot.worker.load_time_ms)
            for mv in self.versions()
            for slot in list(mv.slots)
            if slot.worker is not None and slot.worker.load_time_ms is not None
        ]

    # -- hooks (the hot path) -------------------------------------------------------------------

    def request_done(self, request: RequestRecord) -> None:
        """One inference request answered. ``queue_s`` is None when no worker took it."""
        status, seconds, queue_s, mv = (
            request.status,
            request.seconds,
            request.queue_s,
            request.model,
        )
        if mv is None:  # no per-model series: the name came from the URL (unbounded values)
            child = self._unrouted.get(status)
            if child is None:
                child = self._unrouted[status] = self.unrouted.labels(str(status))
            child.inc()
            return
        series = self._series.get(mv) or self._new_series(mv)
        child = series.codes.get(status)
        if child is None:
            child = series.codes[status] = self.requests.labels(mv.name, mv.version, str(status))
        child.inc()
        ts = series.ts_default if request.version is None else series.ts_named
        ts[0] += 1
        if queue_s is not None:
            series.latency.observe(seconds)
            series.queue.observe(queue_s)
            ts[1] += seconds * 1e6
            ts[2] += queue_s * 1e6
            self._last_total_s = seconds
            self._last_queue_s = queue_s

    def batch_done(self, model: ModelVersion, record: BatchRecord) -> None:
        series = self._series.get(model) or self._new_series(model)
        series.batch.observe(record.size)
        stages = series.stages
        for stage, ms in record.timings_ms.items():
            child = stages.get(stage)
            if child is None:
                if stage not in STAGES:
                    continue  # stage names come from the worker: keep the label bounded
                child = stages[stage] = self.handler_time.labels(model.name, model.version, stage)
            child.observe(ms / 1000)
        handler_ms = record.timings_ms.get("handler")
        if handler_ms is not None:
            self._last_handler_ms = handler_ms
            self.prediction_ms[model.name] = handler_ms
        if record.metrics:
            self.custom.record(model, record.metrics)

    def worker_started(self, model: ModelVersion, worker: WorkerProcess, restart: bool) -> None:
        restarts = self.worker_restarts.labels(model.name, model.version)  # the series exists at 0
        self.start_failures.labels(model.name, model.version)
        self.recycles.labels(model.name, model.version)
        if restart:
            restarts.inc()
        if worker.load_time_ms is not None:
            self.load_time.labels(model.name, model.version).set(worker.load_time_ms / 1000)

    def worker_start_failed(self, model: ModelVersion, error: Exception) -> None:
        self.start_failures.labels(model.name, model.version).inc()

    def worker_recycled(self, model: ModelVersion, worker: WorkerProcess) -> None:
        self.recycles.labels(model.name, model.version).inc()
