"""The SLA autopilot's decisions on the metrics port (serving/autopilot.py), read at scrape time.

Per model version with ``sla_p99_ms`` set (labels ``model``, ``version``)::

    torchbay_autopilot_batch_size              the batch size the queue uses now
    torchbay_autopilot_max_batch_delay_ms      the batch delay the queue uses now
    torchbay_autopilot_p99_ms                  the last window's p99 estimate (queue + service)
    torchbay_autopilot_target_p99_ms           the target
    torchbay_autopilot_arrival_rate            the last window's requests per second
    torchbay_autopilot_utilization             the last window's busy share of the workers
    torchbay_autopilot_changes_total{direction} changes made, "up" or "down"

Torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from torchbay.server.observe.version_collector import VersionCollector

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion

__all__ = ["AutopilotCollector"]

LABELS = ("model", "version")


class AutopilotCollector(VersionCollector):
    """Reads every model version's autopilot when scraped."""

    def families(self) -> tuple[Metric, ...]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"torchbay_autopilot_{name}", doc, labels=LABELS)

        return (
            gauge("batch_size", "The batch size the autopilot set"),
            gauge("max_batch_delay_ms", "The batch delay the autopilot set, ms"),
            gauge("p99_ms", "The last window's p99 estimate (queue + service time), ms"),
            gauge("target_p99_ms", "The autopilot's p99 target, ms"),
            gauge("arrival_rate", "The last window's requests per second"),
            gauge("utilization", "The last window's share of the workers' time spent in batches"),
            CounterMetricFamily(
                "torchbay_autopilot_changes",
                "Changes the autopilot made, by direction",
                labels=(*LABELS, "direction"),
            ),
        )

    def fill(self, mv: ModelVersion, *families: Any) -> None:
        batch, delay, p99, target, arrivals, busy, changes = families
        pilot = getattr(mv, "autopilot", None)
        if pilot is None or not pilot.active:
            return
        labels = [mv.name, mv.version]
        current = pilot.current()
        batch.add_metric(labels, current.batch_size)
        delay.add_metric(labels, current.delay_ms)
        target.add_metric(labels, pilot.target_ms)
        if pilot.last is not None:
            p99.add_metric(labels, pilot.last.p99_ms)
            arrivals.add_metric(labels, pilot.last.arrival_rps)
            busy.add_metric(labels, pilot.last.utilization)
        for direction, count in pilot.changes.items():
            changes.add_metric([*labels, direction], count)
