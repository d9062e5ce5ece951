"""Cancelled requests on the metrics port, read at scrape time from each model version's
``cancelled`` counts (``ModelVersion.finish``, serving/model.py).

Per model version (labels ``model``, ``version``)::

    torchbay_cancelled_requests_total{stage}   requests whose caller left before their answer:
                                               an HTTP client that disconnected, a gRPC call
                                               cancelled or past its deadline, any protocol.
                                               stage="queued": taken out of the queue, never
                                               ran; stage="running": its batch ran, its result
                                               was dropped (the worker kept)

The same requests count as answered with status 499 in ``torchbay_requests_total{code="499"}``
(and in the Triton statistics' ``fail``, as Triton counts a cancelled request a failure: its
``nv_inference_request_failure{reason="CANCELED"}``). TorchServe has no such series. A KServe v1
call refused part-way withdraws the instances it had queued: they count as queued here.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion

__all__ = ["CancelCollector"]

LABELS = ("model", "version")


class CancelCollector(Collector):
    """Reads every model version's cancelled counts when scraped; ``versions`` lists them."""

    def __init__(self, versions: Callable[[], Iterable[ModelVersion]]) -> None:
        self.versions = versions

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(
            "torchbay_cancelled_requests",
            "Requests whose caller left before their answer, by stage (queued: never ran)",
            labels=(*LABELS, "stage"),
        )

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for mv in list(self.versions()):
            for stage, count in mv.cancelled.items():
                family.add_metric([mv.name, mv.version, stage], count)
        yield family
