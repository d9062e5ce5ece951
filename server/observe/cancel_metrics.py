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

from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily

from torchbay.server.observe.version_collector import VersionCollector

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion

__all__ = ["CancelCollector"]

LABELS = ("model", "version")


class CancelCollector(VersionCollector):
    """Reads every model version's cancelled counts when scraped."""

    def families(self) -> tuple[CounterMetricFamily]:
        return (
            CounterMetricFamily(
                "torchbay_cancelled_requests",
                "Requests whose caller left before their answer, by stage (queued: never ran)",
                labels=(*LABELS, "stage"),
            ),
        )

    def fill(self, mv: ModelVersion, family: CounterMetricFamily) -> None:
        for stage, count in mv.cancelled.items():
            family.add_metric([mv.name, mv.version, stage], count)
