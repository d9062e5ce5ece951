"""The response cache's Prometheus series (``plane/cache.py``), on the server's registry.

Per model version (labels ``model``, ``version``)::

    torchbay_cache_hits_total       requests answered from the cache, without a worker
    torchbay_cache_misses_total     cacheable requests the cache did not hold (sent to a worker)
    torchbay_cache_entries          answers held now          (read when scraped)
    torchbay_cache_bytes            bytes they count now      (read when scraped)

A hit is also one request in ``torchbay_requests_total``; like a request refused at admission it
is not in the latency histograms, which count the requests a worker took. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from torchbay.server.observe.custom_metrics import LABELS

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion

# (model version, entries, bytes) of every version that has a cache.
Sizes = Callable[[], Iterable[tuple["ModelVersion", int, int]]]


class CacheMetrics:
    """The counters, bumped by ``done``; the sizes, read from ``watch``'s source when scraped."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.hits = Counter(
            "torchbay_cache_hits",
            "Requests answered from the response cache",
            LABELS,
            registry=registry,
        )
        self.misses = Counter(
            "torchbay_cache_misses",
            "Cacheable requests the response cache did not hold",
            LABELS,
            registry=registry,
        )
        # (name, version, hit) -> its child: by label, never by the version object, which an
        # unregister must free (a version registered again counts on in the same series).
        self._children: dict[tuple[str, str, bool], Any] = {}
        self._sizes: Sizes = list
        registry.register(_SizeCollector(self))

    def done(self, mv: ModelVersion, hit: bool, seconds: float = 0.0) -> None:
        """One look-up (``plane/cache.Counted``)."""
        key = (mv.name, mv.version, hit)
        child = self._children.get(key)
        if child is None:
            counter = self.hits if hit else self.misses
            child = self._children[key] = counter.labels(mv.name, mv.version)
        child.inc()

    def counters(self) -> tuple[Counter, Counter]:
        return self.hits, self.misses

    def forget(self, key: tuple[str, str]) -> None:
        """Drop the children of ``key`` (model, version), whose series were removed."""
        for hit in (True, False):
            self._children.pop((*key, hit), None)

    def watch(self, sizes: Sizes) -> None:
        """Read the caches' sizes from ``sizes`` when scraped."""
        self._sizes = sizes


class _SizeCollector(Collector):
    def __init__(self, metrics: CacheMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterator[Metric]:
        yield from _families()

    def collect(self) -> Iterator[Metric]:
        entries, size = _families()
        for mv, count, nbytes in self.metrics._sizes():
            entries.add_metric([mv.name, mv.version], count)
            size.add_metric([mv.name, mv.version], nbytes)
        yield from (entries, size)


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    return (
        GaugeMetricFamily(
            "torchbay_cache_entries", "Answers held in the response cache", labels=LABELS
        ),
        GaugeMetricFamily(
            "torchbay_cache_bytes",
            "Bytes the response cache's answers count against maxBytes",
            labels=LABELS,
        ),
    )
