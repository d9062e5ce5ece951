"""Priority levels on the metrics port, read at scrape time from each model version's queue
levels (serving/priority.py: ``Levels``, which the plane's exchanges count into).

Per version of a model with ``priorityLevels`` (or a queue policy), labels ``model``,
``version`` and ``level`` (1 the highest, as a request's ``priority`` names it)::

    torchbay_priority_queue_depth              requests waiting at the level now (live and
                                               delayed)
    torchbay_priority_requests_total{code}     requests of the level answered, by status code:
                                               refusals at admission and expiries (503) and
                                               callers that left (499) included; a response
                                               cache hit and a refused priority or timeout
                                               (400) count at no level
    torchbay_priority_timeouts_total{action}   requests whose level's timeout passed while
                                               they were queued: action="REJECT" (answered
                                               503, never run), "DELAY" (moved behind)

They are families of their own: the per-model series (``torchbay_queue_depth``,
``torchbay_requests_total``) keep their labels. A version without levels has no series; the
counts start again with a new version (a reload). Torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from torchbay.server.observe.version_collector import VersionCollector

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion

__all__ = ["PriorityCollector"]

LABELS = ("model", "version", "level")


class PriorityCollector(VersionCollector):
    """Reads every model version's queue levels when scraped."""

    def families(self) -> tuple[GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                "torchbay_priority_queue_depth",
                "Requests waiting at each priority level (1 the highest)",
                labels=LABELS,
            ),
            CounterMetricFamily(
                "torchbay_priority_requests",
                "Requests answered at each priority level, by status code",
                labels=(*LABELS, "code"),
            ),
            CounterMetricFamily(
                "torchbay_priority_timeouts",
                "Requests whose priority level's timeout passed while queued, by action",
                labels=(*LABELS, "action"),
            ),
        )

    def fill(
        self,
        mv: ModelVersion,
        depth: GaugeMetricFamily,
        requests: CounterMetricFamily,
        timeouts: CounterMetricFamily,
    ) -> None:
        levels = mv.queue.levels
        for i in range(len(levels) if levels is not None else 0):
            labels = [mv.name, mv.version, str(i + 1)]
            depth.add_metric(labels, levels.queued_at(i))
            for code, count in sorted(levels.answered[i].items()):
                requests.add_metric([*labels, str(code)], count)
            for action, count in levels.timeouts[i].items():
                timeouts.add_metric([*labels, action], count)
