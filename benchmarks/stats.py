"""Arithmetic of a load test: percentiles, rates, and open-loop arrival schedules. Pure
functions, no I/O. Percentiles are numpy's ``method="linear"``, the definition this harness used
before numpy (tested).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from torchbay.benchmarks.errors import BenchError

Arrival = Literal["constant", "poisson"]
# The percentiles every report shows (p99.9 is why results keep every latency, not a histogram).
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
PERCENTILE_METHOD = "linear"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``; NaN when it is empty."""
    if not 0.0 <= q <= 100.0:
        raise BenchError(f"percentile {q} is outside 0..100")
    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=float), q, method=PERCENTILE_METHOD))


@dataclass(frozen=True)
class LatencySummary:
    """Latencies in milliseconds over ``count`` samples (NaN when there were none)."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float

    def as_dict(self) -> dict[str, float]:
        """The fields, with p99.9 spelled ``p99.9_ms`` (the JSON key reports always used)."""
        return {("p99.9_ms" if k == "p999_ms" else k): v for k, v in asdict(self).items()}


def summarize(latencies_s: Sequence[float]) -> LatencySummary:
    """Summarize latencies given in SECONDS into a millisecond :class:`LatencySummary`."""
    ms = 1e3 * np.asarray(latencies_s, dtype=float)
    if ms.size == 0:
        return LatencySummary(0, *(math.nan,) * 6)
    quantiles = np.percentile(ms, PERCENTILES, method=PERCENTILE_METHOD).tolist()
    return LatencySummary(ms.size, float(ms.mean()), *quantiles, float(ms.max()))


def rate(count: int, seconds: float) -> float:
    """Events per second; NaN for an empty or zero-length window (never a division error)."""
    return count / seconds if seconds > 0 and count >= 0 else math.nan


def error_rate(errors: int, total: int) -> float:
    """Share of failed requests in 0..1; 0 when nothing was sent."""
    return errors / total if total > 0 else 0.0


def spread_pct(values: Sequence[float]) -> float:
    """(max - min) / mean in percent: how far repeated measurements disagree; NaN if < 2."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < 2:
        return math.nan
    mean = math.fsum(finite) / len(finite)
    return 100.0 * (max(finite) - min(finite)) / mean if mean else math.nan


def arrival_offsets(
    rate_per_s: float,
    *,
    arrival: Arrival = "constant",
    seed: int = 0,
    phase: float = 0.0,
    steps: tuple[tuple[float, float], ...] = (),
) -> Iterator[float]:
    """Send times (seconds after the start) of an open loop: ``constant`` at ``(k + phase) /
    rate`` (``phase``, 0..1, interleaves the processes that each run a share), endless or over
    ``steps`` (:func:`stepped_offsets`); ``poisson`` with exponential gaps from
    ``random.Random(seed)``, the first one included."""
    if not rate_per_s > 0:
        raise BenchError(f"rate must be > 0, not {rate_per_s}")
    if arrival == "constant" or steps:
        yield from stepped_offsets(steps or ((math.inf, rate_per_s),), phase=phase)
    elif arrival == "poisson":
        rng = random.Random(seed)
        t = 0.0
        while True:
            t += rng.expovariate(rate_per_s)
            yield t
    else:
        raise BenchError(f"unknown arrival process {arrival!r}; choose constant or poisson")


def stepped_offsets(
    steps: tuple[tuple[float, float], ...], scale: float = 1.0, phase: float = 0.0
) -> Iterator[float]:
    """Constant arrivals at ``rate * scale`` for ``seconds`` per step, the steps back to back."""
    begin = 0.0
    for seconds, rate in steps:
        gap = 1.0 / (rate * scale)
        k = 0
        while (offset := begin + (k + phase) * gap) < begin + seconds:
            yield offset
            k += 1
        begin += seconds


def histogram_mean(sum_delta: float, count_delta: float) -> float:
    """Mean of a Prometheus histogram over a window from its ``_sum`` / ``_count`` deltas."""
    return sum_delta / count_delta if count_delta > 0 else math.nan


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile``: ``q`` in 0..1 over cumulative ``(upper bound, count)``
    buckets (ascending, the last being +Inf), interpolating linearly inside the bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    total = buckets[-1][1]
    target = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= target:
            if math.isinf(bound):
                return prev_bound  # as Prometheus: the highest finite bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (target - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound
