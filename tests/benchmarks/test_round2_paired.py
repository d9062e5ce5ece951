"""The alternating-slice comparison of round two's cnn c=1 row (the live part runs in
test_round2_live.py)."""

from __future__ import annotations

import math

from torchbay.benchmarks.loadplan import LoadResult
from torchbay.benchmarks.round2_rows import order, pooled
from torchbay.benchmarks.stats import LatencySummary


def _slice(ok: int, window_s: float, p50: float, p99: float, sent: int | None = None):
    lat = LatencySummary(ok, p50, p50, p99, p99, p99, p99)
    nothing = LatencySummary(0, *(math.nan,) * 6)
    return LoadResult(
        mode="closed",
        offered_rate=None,
        concurrency=1,
        window_s=window_s,
        sent=ok if sent is None else sent,
        completed=ok,
        ok=ok,
        statuses={"200": ok},
        latency=lat,
        service=lat,
        lag=nothing,
        req_per_s=ok / window_s,
        ok_per_s=ok / window_s,
        generator_cpu_pct=[],
        behind=[],
    )


def test_order_mirrors_every_pair_so_steady_drift_cancels() -> None:
    assert order(("a", "b"), 4) == ["a", "b", "b", "a", "a", "b", "b", "a"]
    # A host slowing down steadily: slice i serves 100 - i req/s whoever it is. Both get the
    # same total, so the ratio is exactly 1; measured a then b, it would be 0.9-something.
    turns = order(("a", "b"), 4)
    served = {"a": 0, "b": 0}
    for i, name in enumerate(turns):
        served[name] += 100 - i
    assert served["a"] == served["b"]


def test_pooled_sums_answers_over_time_and_keeps_the_worst_tail() -> None:
    slices = [_slice(100, 1.0, 10.0, 20.0), _slice(300, 2.0, 12.0, 50.0, sent=302)]
    assert pooled(slices) == {"req_s": 400 / 3.0, "p50_ms": 11.0, "p99_ms": 50.0, "errors": 2.0}
