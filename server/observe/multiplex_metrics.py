"""Many models per host on the metrics port (``max_loaded_models``, serving/multiplex.py), read
at scrape time from the registry's multiplexer; nothing while the budget is off.

Per model version (labels ``model``, ``version``)::

    torchbay_model_loaded              1 while the version holds workers, 0 while unloaded
    torchbay_model_loads_total         loads: at registration, then on a request that found it
                                       unloaded
    torchbay_model_evictions_total     unloads to make room for another version

and for the server::

    torchbay_loaded_models             versions holding a place of the budget (loaded or loading)
    torchbay_max_loaded_models         the budget

TorchServe and Triton have no such series. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["MultiplexCollector"]

LABELS = ("model", "version")


class MultiplexCollector(Collector):
    """Reads the multiplexer of ``metrics.models`` (the ModelRegistry, once it exists)."""

    def __init__(self, metrics: Any) -> None:  # ServerMetrics: its ``models``
        self.metrics = metrics

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily | CounterMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "torchbay_model_loaded",
                "1 while the model version holds workers, 0 while unloaded (max_loaded_models)",
                labels=LABELS,
            ),
            CounterMetricFamily(
                "torchbay_model_loads", "Loads of the model version's workers", labels=LABELS
            ),
            CounterMetricFamily(
                "torchbay_model_evictions",
                "Unloads of the model version to make room for another",
                labels=LABELS,
            ),
            GaugeMetricFamily(
                "torchbay_loaded_models", "Model versions loaded or loading (max_loaded_models)"
            ),
            GaugeMetricFamily(
                "torchbay_max_loaded_models", "The most model versions loaded at once"
            ),
        )

    def collect(self) -> Iterator[Metric]:
        models = self.metrics.models
        multiplexer = getattr(models, "multiplexer", None)
        if multiplexer is None:
            return
        loaded, loads, evictions, held, limit = self._families()
        for mv in list(models.all_versions()):
            labels = [mv.name, mv.version]
            residency = multiplexer.residency(mv)
            loaded.add_metric(labels, 1.0 if multiplexer.loaded(mv) else 0.0)
            loads.add_metric(labels, residency.loads)
            evictions.add_metric(labels, residency.evictions)
        held.add_metric([], len(multiplexer.held()))
        limit.add_metric([], multiplexer.limit)
        yield from (loaded, loads, evictions, held, limit)
