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

TorchServe's metrics (``self.ts``, observe.ts_families), as its ``metrics_config`` declares them
and its ``metrics_mode`` publishes them (docs/metrics.md; tests/data/torchserve/metrics_modes
holds TorchServe 0.12's record): the hooks below turn each request, batch, worker start and HTTP
answer into TorchServe's events (``Requests2XX/4XX/5XX`` for every answer of the HTTP listeners,
``counting``; ``ts_inference_*`` per request routed to a model, version ``"default"`` when the URL
named none; ``QueueTime``, ``WorkerThreadTime``, ``WorkerLoadTime``; ``HandlerTime`` and
``PredictionTime`` per batch) and ``metrics_app`` serves the Prometheus ones after the registry's
text, always as text format 0.0.4 (TorchServe serves no OpenMetrics), uncompressed.
Host and GPU metrics: observe.system_metrics. Custom handler metrics: observe.custom_metrics.
Cancelled requests (``torchbay_cancelled_requests_total{stage}``): observe.cancel_metrics. Open and
ended sequences (``torchbay_open_sequences``, ``torchbay_sequences_ended_total``):
observe.sequence_metrics. Priority levels (``torchbay_priority_queue_depth``,
``torchbay_priority_requests_total{level,code}``,
``torchbay_priority_timeouts_total{level,action}``): observe.priority_metrics. Loaded models,
loads and evictions (``max_loaded_models``): observe.multiplex_metrics.

An unregistered version's series stay (they count on when it comes back) for the 100 most
recently used versions gone; older ones' are removed (observe.retired), its handler metrics'
(observe.custom_metrics) too.

The hot path only bumps floats and cached labelled children; everything that describes state
(queue depth, in-flight, workers) is read when scraped, by a collector.
"""

from __future__ import annotations

import logging
import socket
import weakref
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from torchbay.server.config.metrics_config import MetricsSpec, load_metrics_config
from torchbay.server.observe.autopilot_metrics import AutopilotCollector
from torchbay.server.observe.cache_metrics import CacheMetrics
from torchbay.server.observe.cancel_metrics import CancelCollector
from torchbay.server.observe.custom_metrics import LABELS, CustomMetrics, utf8_records
from torchbay.server.observe.logs import RequestRecord
from torchbay.server.observe.model_state_metrics import ModelStateCollector
from torchbay.server.observe.multiplex_metrics import MultiplexCollector
from torchbay.server.observe.priority_metrics import PriorityCollector
from torchbay.server.observe.retired import Retired
from torchbay.server.observe.sequence_metrics import SequenceCollector
from torchbay.server.observe.system_metrics import GpuCollector, HostCollector, load_nvml
from torchbay.server.observe.ts_families import SYSTEM, MetricsLog, TsFamilies
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
        # TorchServe's model_name, model_version, hostname: "default" when the URL named none.
        self.ts_default = (name, "default", metrics.hostname)
        self.ts_named = (name, version, metrics.hostname)


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
        spec: MetricsSpec | None = None,
        mode: str = "prometheus",
        metrics_log: MetricsLog | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.hostname = hostname or socket.gethostname()
        self.models: ModelRegistry | None = None
        self._declare(self.registry)
        # Weak: an unregistered version's cached children must not keep the version alive.
        self._series: weakref.WeakKeyDictionary[ModelVersion, _Series] = weakref.WeakKeyDictionary()
        self._unrouted: dict[int, Any] = {}
        # TorchServe's metrics as metrics_config and metrics_mode say (observe.ts_families).
        self.ts = TsFamilies(spec or load_metrics_config(None), mode, self.hostname, metrics_log)
        self._host = ("Host", self.hostname)
        self._last_handler_ms = 0.0
        self.custom = CustomMetrics(
            self.registry, max_metrics=max_custom_metrics, reserved=self.ts.writes
        )
        # The reverse, for auto-detect: the custom metrics' names, and the host collector's.
        written, host = self.custom.written, SYSTEM if system_metrics else frozenset()
        self.ts.taken = lambda name: name in written or name in host
        self.cache = CacheMetrics(self.registry)  # the response cache's (plane/cache.py)
        # The series of versions gone stay for the KEEP most recently used (observe.retired).
        self.retired = Retired(self._per_version(), self._registered, self._forget)
        self.registry.register(ModelStateCollector(self))
        self.registry.register(MultiplexCollector(self))  # max_loaded_models (serving/multiplex)
        collectors = (AutopilotCollector, CancelCollector, PriorityCollector, SequenceCollector)
        for collector in collectors:  # they read self.versions()
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

    def _per_version(self) -> list[Any]:
        """The families labelled by model version (observe.retired.Family)."""
        plain = (self.latency, self.queue_time, self.batch_size, self.worker_restarts)
        plain += (self.start_failures, self.recycles, self.load_time, *self.cache.counters())
        stages = [(stage,) for stage in STAGES]
        keyed = [
            (self.requests, (*LABELS, "code"), None),  # any status: looked up
            (self.handler_time, (*LABELS, "stage"), stages),
        ]
        return [*keyed, *((family, LABELS, [()]) for family in plain)]

    def _forget(self, key: tuple[str, str]) -> None:
        """Version ``key``'s series are gone (observe.retired): its handler metrics' go too."""
        self.cache.forget(key)
        self.custom.forget(key)

    def _registered(self) -> list[tuple[str, str]]:
        return [(mv.name, mv.version) for mv in self.versions()]

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
        self.ts.close()
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None

    def _new_series(self, mv: ModelVersion) -> _Series:
        self.retired.used((mv.name, mv.version))
        series = self._series[mv] = _Series(self, mv)
        return series

    def count_response(self, status: int) -> None:
        """One HTTP answer (Requests2XX/4XX/5XX): TorchServe counts any status outside 2xx and
        4xx as 5XX."""
        cls = status // 100
        name = "Requests2XX" if cls == 2 else "Requests4XX" if cls == 4 else "Requests5XX"
        self.ts.update(name, self._host, 1.0)

    # -- hooks (the hot path) -------------------------------------------------------------------

    def request_done(self, request: RequestRecord) -> None:
        """One inference request answered. ``queue_s`` is None when no worker took it."""
        status, seconds, queue_s = request.status, request.seconds, request.queue_s
        mv = request.model
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
        labels = series.ts_default if request.version is None else series.ts_named
        self.ts.update("ts_inference_requests_total", labels, 1.0)
        if queue_s is not None:
            series.latency.observe(seconds)
            series.queue.observe(queue_s)
            self._ts_timed(labels, status, seconds, queue_s)

    def _ts_timed(
        self, labels: tuple[str, ...], status: int, seconds: float, queue_s: float
    ) -> None:
        """TorchServe's times of a request a worker took: WorkerThreadTime (whole ms outside the
        queue and the handler) for every one; the latency counters and QueueTime (whole ms, its
        TimeUnit conversion) only for a success (TorchServe's sendError skips them)."""
        update = self.ts.update
        outside = (seconds - queue_s) * 1000 - self._last_handler_ms
        update("WorkerThreadTime", self._host, float(max(0, int(outside))))
        if status < 400:
            update("ts_inference_latency_microseconds", labels, seconds * 1e6)
            update("ts_queue_latency_microseconds", labels, queue_s * 1e6)
            update("QueueTime", self._host, float(int(queue_s * 1000)))

    def batch_done(self, model: ModelVersion, record: BatchRecord) -> None:
        series = self._series.get(model) or self._new_series(model)
        handler_ms = record.timings_ms.get("handler")
        if not record.inference:  # a describe's batch: TorchServe times it, counts no batch
            outside = record.run_s * 1000 - (handler_ms or 0.0)
            self.ts.update("WorkerThreadTime", self._host, float(max(0, int(outside))))
        else:
            series.batch.observe(record.size)
            stages = series.stages
            for stage, ms in record.timings_ms.items():
                child = stages.get(stage)
                if child is None:
                    if stage not in STAGES:
                        continue  # stage names come from the worker: keep the label bounded
                    labels = (model.name, model.version, stage)
                    child = stages[stage] = self.handler_time.labels(*labels)
                child.observe(ms / 1000)
            if handler_ms is not None:
                self._last_handler_ms = handler_ms
        rids = ",".join(record.request_ids)
        if handler_ms is not None and record.answered:
            dims = {"ModelName": model.name, "Level": "Model"}
            for name in ("HandlerTime", "PredictionTime"):  # TorchServe's handler and service
                self.ts.model_update(name, "gauge", "ms", dims, round(handler_ms, 2), rids)
        if record.metrics:
            self.handler_metrics(model, record.metrics, rids)

    def handler_metrics(self, model: ModelVersion, records: list[dict], rids: str) -> None:
        """A handler's metric records (handlers.metrics): TorchServe's model metrics, the rest
        torchbay's own; a batch's, its initialize's, or a batch's its worker died in."""
        self.custom.record(model, self.ts.model_records(utf8_records(records), rids))

    def worker_started(self, model: ModelVersion, worker: WorkerProcess, restart: bool) -> None:
        self.retired.used((model.name, model.version))
        restarts = self.worker_restarts.labels(model.name, model.version)  # the series exists at 0
        self.start_failures.labels(model.name, model.version)
        self.recycles.labels(model.name, model.version)
        if restart:
            restarts.inc()
        if worker.load_time_ms is not None:
            self.load_time.labels(model.name, model.version).set(worker.load_time_ms / 1000)
            labels = (worker.name, "Host", self.hostname)
            self.ts.update("WorkerLoadTime", labels, float(worker.load_time_ms))
        self.ts.update("WorkerThreadTime", self._host, 0.0)  # TorchServe's load is a job too
        if worker.load_metrics:  # what the handler's initialize recorded (TorchServe emits it)
            self.handler_metrics(model, worker.load_metrics, "")

    def worker_start_failed(self, model: ModelVersion, error: Exception) -> None:
        self.retired.used((model.name, model.version))
        self.start_failures.labels(model.name, model.version).inc()

    def worker_recycled(self, model: ModelVersion, worker: WorkerProcess) -> None:
        self.recycles.labels(model.name, model.version).inc()
