"""Sequences on the metrics port, read at scrape time from each sequence model version's
scheduler (serving/sequences.py).

Per sequence model version (labels ``model``, ``version``)::

    torchbay_open_sequences                    sequences open now (bound to a worker or waiting
                                               to be), at most maxNumSequence
    torchbay_sequences_ended_total{reason}     sequences ended, by reason: end (its last request
                                               was answered), idle (sequenceMaxIdleMSec),
                                               timeout (sequenceTimeoutMSec, or a request's
                                               timeout while waiting for a slot), worker (its worker
                                               died or was replaced), cancelled (a queued
                                               request's caller left: Triton's API); and
                                               refused: requests refused for naming an ended
                                               sequence

A version that is not a sequence model has no series. TorchServe has none. Torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from torchbay.server.observe.version_collector import VersionCollector
from torchbay.server.serving.sequences import SequenceQueue

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion

__all__ = ["SequenceCollector"]

LABELS = ("model", "version")


class SequenceCollector(VersionCollector):
    """Reads every sequence model version's scheduler when scraped."""

    def families(self) -> tuple[GaugeMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                "torchbay_open_sequences",
                "Sequences open now (maxNumSequence at most)",
                labels=LABELS,
            ),
            CounterMetricFamily(
                "torchbay_sequences_ended",
                "Sequences ended, by reason (refused: requests naming an ended sequence)",
                labels=(*LABELS, "reason"),
            ),
        )

    def fill(self, mv: ModelVersion, opened: GaugeMetricFamily, ended: CounterMetricFamily) -> None:
        queue = mv.queue
        if not isinstance(queue, SequenceQueue):
            return
        opened.add_metric([mv.name, mv.version], len(queue.open))
        for reason, count in queue.ended.items():
            ended.add_metric([mv.name, mv.version, reason], count)
