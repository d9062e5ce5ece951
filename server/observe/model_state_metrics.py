"""The series read when ``/metrics`` is scraped: each model version's state (queue depth,
requests in flight, workers by state, readiness, admission refusals). TorchServe's own series
are ``observe.ts_metrics``'s. Torch-free."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from torchbay.server.observe.custom_metrics import LABELS
from torchbay.server.serving.handle import WorkerState
from torchbay.server.serving.model import ModelStatus


class ModelStateCollector(Collector):
    """What is read when scraped: model state (TorchServe's series: observe.ts_metrics)."""

    def __init__(self, metrics: Any) -> None:  # ServerMetrics: its ``models``
        self.metrics = metrics

    def describe(self) -> Iterator[Metric]:
        yield from self._model_families()

    def _model_families(self) -> tuple[GaugeMetricFamily | CounterMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "torchbay_queue_depth", "Requests waiting in the queue", labels=LABELS
            ),
            GaugeMetricFamily(
                "torchbay_inflight_requests",
                "Requests admitted and not yet answered (queued or running)",
                labels=LABELS,
            ),
            GaugeMetricFamily(
                "torchbay_workers", "Worker processes by state", labels=(*LABELS, "state")
            ),
            GaugeMetricFamily(
                "torchbay_model_ready", "1 when the model version is READY", labels=LABELS
            ),
            CounterMetricFamily(
                "torchbay_admission_rejections",
                "Requests refused 503 by the queue-time bound or a full queue, by reason",
                labels=(*LABELS, "reason"),
            ),
        )

    def collect(self) -> Iterator[Metric]:
        yield from self._collect_models()

    def _collect_models(self) -> Iterator[Metric]:
        m = self.metrics
        depth, inflight, workers, ready, refused = self._model_families()
        models = m.models
        versions = list(models.all_versions()) if models is not None else []
        states = list(WorkerState)
        for mv in versions:
            labels = [mv.name, mv.version]
            depth.add_metric(labels, len(mv.queue))
            inflight.add_metric(labels, mv.inflight)
            ready.add_metric(labels, 1.0 if mv.status is ModelStatus.READY else 0.0)
            for reason, count in mv.admission.rejections.items():
                refused.add_metric([*labels, reason], count)
            counts = dict.fromkeys(states, 0)
            for slot in list(mv.slots):
                counts[slot.state] += 1
            for state, count in counts.items():
                workers.add_metric([*labels, state.value], count)
        yield from (depth, inflight, workers, ready, refused)
