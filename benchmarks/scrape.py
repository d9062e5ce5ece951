"""The server's own view of a run: ``/metrics`` scraped before and after, differenced per model
(and version): request counts by code, histogram means and bucket-interpolated p99s."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.managed import http_call
from torchbay.benchmarks.stats import histogram_mean, histogram_quantile

# sample key: (metric sample name, sorted label items)
Sample = tuple[str, tuple[tuple[str, str], ...]]
HANDLER = "torchbay_handler_seconds"


@dataclass(frozen=True)
class Snapshot:
    """Every sample of one scrape, keyed by name and labels."""

    samples: dict[Sample, float]


def fetch_metrics(host: str, port: int, *, timeout: float = 5.0) -> str:
    """GET /metrics as text; raises BenchError when the endpoint does not answer 200."""
    status, raw = http_call(host, port, "GET", "/metrics", timeout=timeout)
    body = raw.decode("utf-8", "replace")
    if status != 200:
        raise BenchError(f"/metrics answered {status}: {body[:200]}")
    return body


def snapshot(host: str, port: int | None, notes: list[str]) -> Snapshot | None:
    """The server's metrics now; None without a metrics port, or when the scrape fails (the
    reason goes to ``notes``: a run still reports its client view)."""
    if port is None:
        return None
    try:
        return parse_snapshot(fetch_metrics(host, port))
    except BenchError as exc:
        notes.append(f"server view unavailable: {exc}")
        return None


def parse_snapshot(text: str) -> Snapshot:
    """Parse Prometheus text exposition into a :class:`Snapshot`."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[Sample, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    except ValueError as exc:
        raise BenchError(f"cannot parse /metrics: {exc}") from None
    return Snapshot(samples)


@dataclass(frozen=True)
class ServerView:
    """The server's numbers over the window (times in ms; NaN when the server recorded none)."""

    requests: dict[str, float]
    request_mean_ms: float
    request_p99_ms: float
    queue_mean_ms: float
    queue_p99_ms: float
    handler_mean_ms: dict[str, float]
    batches: float
    mean_batch_size: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _deltas(
    before: Snapshot, after: Snapshot, name: str, labels: dict[str, str], key: str
) -> dict[str, float]:
    """``name``'s change between two snapshots over the series matching ``labels``, summed per
    value of the label ``key`` ("" sums them all)."""
    out: dict[str, float] = defaultdict(float)
    for snap, sign in ((after, 1.0), (before, -1.0)):
        for (n, lab), value in snap.samples.items():
            have = dict(lab)
            if n == name and all(have.get(k) == v for k, v in labels.items()):
                out[have.get(key, "?") if key else ""] += sign * value
    return out


def histogram_delta(
    before: Snapshot, after: Snapshot, name: str, labels: dict[str, str]
) -> tuple[float, float, list[tuple[float, float]]]:
    """``name``'s change between two snapshots, summed over series matching ``labels``: its
    count, its mean and its buckets (upper bound, count)."""
    buckets = _deltas(before, after, name + "_bucket", labels, "le")
    count = sum(_deltas(before, after, name + "_count", labels, "").values())
    total = sum(_deltas(before, after, name + "_sum", labels, "").values())
    return count, histogram_mean(total, count), sorted((float(le), v) for le, v in buckets.items())


def _ms(seconds: float) -> float:
    return 1e3 * seconds if math.isfinite(seconds) else math.nan


def server_view(
    before: Snapshot, after: Snapshot, model: str, version: str | None = None
) -> ServerView:
    """What the server recorded for ``model`` (all versions unless ``version``) in between."""
    labels = {"model": model} | ({"version": version} if version else {})
    requests = _deltas(before, after, "torchbay_requests_total", labels, "code")
    delta = lambda name: histogram_delta(before, after, "torchbay_" + name, labels)  # noqa: E731
    _, latency_mean, latency = delta("request_latency_seconds")
    _, queue_mean, queue = delta("queue_latency_seconds")
    batches, batch_mean, _ = delta("batch_size")
    sums = _deltas(before, after, HANDLER + "_sum", labels, "stage")
    counts = _deltas(before, after, HANDLER + "_count", labels, "stage")
    stages = sorted(st for st in counts if st != "?")  # "?": a series without a stage label
    handler = {st: _ms(histogram_mean(sums[st], counts[st])) for st in stages}
    return ServerView(
        requests={k: v for k, v in sorted(requests.items()) if v},
        request_mean_ms=_ms(latency_mean),
        request_p99_ms=_ms(histogram_quantile(0.99, latency)),
        queue_mean_ms=_ms(queue_mean),
        queue_p99_ms=_ms(histogram_quantile(0.99, queue)),
        handler_mean_ms=handler,
        batches=batches,
        mean_batch_size=batch_mean,
    )
