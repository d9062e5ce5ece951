"""Percentile, rate and histogram arithmetic against known inputs; the open-loop schedule."""

from __future__ import annotations

import itertools
import math

import pytest

from torchbay.benchmarks import stats
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadPlan, Target, split_plan


def test_percentile_interpolates_between_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert stats.percentile(values, 0) == 1.0
    assert stats.percentile(values, 100) == 4.0
    assert stats.percentile(values, 50) == pytest.approx(2.5)
    assert stats.percentile(values, 90) == pytest.approx(3.7)  # numpy.percentile gives 3.7
    assert stats.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert stats.percentile([7.0], 99.9) == 7.0
    assert math.isnan(stats.percentile([], 50))
    with pytest.raises(BenchError):
        stats.percentile(values, 101)


def test_summarize_in_milliseconds() -> None:
    s = stats.summarize([0.004, 0.001, 0.003, 0.002, 0.010])  # unsorted on purpose
    assert s.count == 5
    assert s.p50_ms == pytest.approx(3.0)
    assert s.max_ms == pytest.approx(10.0)
    assert s.mean_ms == pytest.approx(4.0)
    assert s.p99_ms == pytest.approx(9.76)  # 4 + 0.96 * (10 - 4) ranks, in ms
    assert stats.summarize([]).count == 0


def test_rates_and_spread() -> None:
    assert stats.rate(500, 2.0) == 250.0
    assert math.isnan(stats.rate(5, 0.0))
    assert stats.error_rate(3, 300) == pytest.approx(0.01)
    assert stats.error_rate(0, 0) == 0.0
    assert stats.spread_pct([90.0, 100.0, 110.0]) == pytest.approx(20.0)
    assert math.isnan(stats.spread_pct([5.0]))


def test_histogram_mean_and_quantile() -> None:
    assert stats.histogram_mean(3.0, 6.0) == 0.5
    assert math.isnan(stats.histogram_mean(1.0, 0.0))
    buckets = [(0.1, 10.0), (0.2, 30.0), (0.5, 40.0), (math.inf, 40.0)]
    assert stats.histogram_quantile(0.5, buckets) == pytest.approx(0.15)  # 20th of 40 in (0.1, 0.2]
    assert stats.histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    over = [(0.1, 1.0), (math.inf, 10.0)]
    assert stats.histogram_quantile(0.99, over) == 0.1  # Prometheus: highest finite bound
    assert math.isnan(stats.histogram_quantile(0.5, []))


def test_constant_schedule_is_exact_and_phased() -> None:
    first = list(itertools.islice(stats.arrival_offsets(100.0), 4))
    assert first == pytest.approx([0.0, 0.01, 0.02, 0.03])
    shifted = list(itertools.islice(stats.arrival_offsets(50.0, phase=0.5), 3))
    assert shifted == pytest.approx([0.01, 0.03, 0.05])
    with pytest.raises(BenchError):
        next(stats.arrival_offsets(0.0))


def test_poisson_schedule_is_seeded_and_has_the_mean_rate() -> None:
    a = list(itertools.islice(stats.arrival_offsets(200.0, arrival="poisson", seed=7), 20000))
    b = list(itertools.islice(stats.arrival_offsets(200.0, arrival="poisson", seed=7), 20000))
    c = list(itertools.islice(stats.arrival_offsets(200.0, arrival="poisson", seed=8), 20000))
    assert a == b
    assert a != c
    assert all(y > x for x, y in itertools.pairwise(a))
    assert len(a) / a[-1] == pytest.approx(200.0, rel=0.03)  # 20k gaps: sd of the mean ~0.7%
    gaps = [y - x for x, y in itertools.pairwise(a)]
    cv = math.sqrt(sum((g - 1 / 200) ** 2 for g in gaps) / len(gaps)) * 200
    assert cv == pytest.approx(1.0, rel=0.05)  # exponential gaps: sd == mean


def test_split_plan_shares_everything_exactly() -> None:
    target = Target("127.0.0.1", 1, "/", (b"x",))
    closed = split_plan(LoadPlan(target, "closed", concurrency=7, requests=10), 3)
    assert [s.concurrency for s in closed] == [3, 2, 2]
    assert sum(s.requests or 0 for s in closed) == 10
    opened = split_plan(LoadPlan(target, "open", rate=90.0), 3)
    assert [s.rate for s in opened] == pytest.approx([30.0, 30.0, 30.0])
    assert [s.phase for s in opened] == pytest.approx([0.0, 1 / 3, 2 / 3])
    assert len({s.seed for s in opened}) == 3


def _rank_interpolated(sorted_values: list[float], q: float) -> float:
    """The hand-written definition the harness used before numpy (kept here as the oracle)."""
    h = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


def test_numpy_percentiles_match_the_old_definition() -> None:
    """numpy's method must give the numbers the old code gave, so old and new runs compare."""
    import random

    rng = random.Random(3)
    for n in (1, 2, 7, 100, 1001):
        values = [rng.expovariate(200.0) for _ in range(n)]
        ordered = sorted(values)
        summary = stats.summarize(values)
        for q, got in zip(
            stats.PERCENTILES,
            (summary.p50_ms, summary.p90_ms, summary.p99_ms, summary.p999_ms),
            strict=True,
        ):
            assert stats.percentile(values, q) == pytest.approx(_rank_interpolated(ordered, q))
            assert got == pytest.approx(1e3 * _rank_interpolated(ordered, q))
