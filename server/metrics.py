"""Prometheus metrics: one CollectorRegistry owned by the server, fed from the frontend only.

Workers never touch Prometheus: their stage timings and custom metrics ride back in each
``Result`` and are recorded here. Torch-free.
"""

from __future__ import annotations

import socket
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from torchbay.server.model import BatchRecord, ModelVersion, Observer
from torchbay.server.workers import WorkerProcess

# Latency buckets (seconds): sub-millisecond overhead-bound models up to slow ones.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1,
    0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics(Observer):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.hostname = socket.gethostname()
        r = self.registry
        labels = ("model", "version")
        self.requests = Counter(
            "torchbay_requests", "Inference requests by status code", (*labels, "code"), registry=r
        )
        self.latency = Histogram(
            "torchbay_request_latency_seconds",
            "End-to-end latency in the frontend, queue included",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "torchbay_queue_latency_seconds",
            "Time a request waited in its model's queue",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "torchbay_batch_size", "Requests per batch", labels, buckets=BATCH_BUCKETS, registry=r
        )
        self.handler_time = Histogram(
            "torchbay_handler_seconds",
            "Handler time per batch by stage (preprocess, inference, postprocess, handler)",
            (*labels, "stage"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.worker_restarts = Counter(
            "torchbay_worker_restarts", "Worker processes restarted", labels, registry=r
        )
        # TorchServe's frontend names, so existing dashboards keep working.
        ts_labels = ("model_name", "model_version", "hostname")
        self.ts_requests = Counter(
            "ts_inference_requests", "Total number of inference requests.", ts_labels, registry=r
        )
        self.ts_latency = Counter(
            "ts_inference_latency_microseconds",
            "Cumulative inference duration in microseconds",
            ts_labels,
            registry=r,
        )
        self.ts_queue = Counter(
            "ts_queue_latency_microseconds",
            "Cumulative queue duration in microseconds",
            ts_labels,
            registry=r,
        )
        self.ts_codes = {
            cls: Counter(
                f"Requests{cls}XX",
                f"Total number of requests with response in {cls}00-{cls}99 status code range.",
                ("Level", "Hostname"),
                registry=r,
            ).labels("Host", self.hostname)
            for cls in (2, 4, 5)
        }
        self._children: dict[tuple[str, str], Any] = {}

    def _model(self, name: str, version: str) -> Any:
        key = (name, version)
        children = self._children.get(key)
        if children is None:
            children = (
                self.latency.labels(name, version),
                self.queue_time.labels(name, version),
                self.batch_size.labels(name, version),
                self.ts_requests.labels(name, version, self.hostname),
                self.ts_latency.labels(name, version, self.hostname),
                self.ts_queue.labels(name, version, self.hostname),
            )
            self._children[key] = children
        return children

    # -- hooks --------------------------------------------------------------------------------

    def request_done(
        self, name: str, version: str | None, status: int, seconds: float, mv: ModelVersion | None
    ) -> None:
        cls = self.ts_codes.get(status // 100)
        if cls is not None:
            cls.inc()
        if mv is None:
            return  # unknown model: no per-model series (unbounded label values)
        self.requests.labels(mv.name, mv.version, str(status)).inc()
        latency, _, _, ts_requests, ts_latency, _ = self._model(mv.name, mv.version)
        latency.observe(seconds)
        ts_requests.inc()
        ts_latency.inc(seconds * 1e6)

    def batch_done(self, model: ModelVersion, record: BatchRecord) -> None:
        _, queue_time, batch_size, _, _, ts_queue = self._model(model.name, model.version)
        batch_size.observe(record.size)
        for waited in record.queue_times_s:
            queue_time.observe(waited)
        ts_queue.inc(sum(record.queue_times_s) * 1e6)
        for stage, ms in record.timings_ms.items():
            self.handler_time.labels(model.name, model.version, stage).observe(ms / 1000)

    def worker_started(self, model: ModelVersion, worker: WorkerProcess, restart: bool) -> None:
        if restart:
            self.worker_restarts.labels(model.name, model.version).inc()
