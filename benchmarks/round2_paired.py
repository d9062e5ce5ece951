"""Two configurations of one model compared in alternating slices on one server (round two's
cnn c=1 row: batch 8 against batch 1).

Measured one after the other, two runs of the same server differ by the host's drift: on a
shared 2-core machine one minute can be 10% slower than the next, as large as the effect the
row judges. Here one server serves both (each its own archive copy and worker; the idle one
costs nothing) and the load alternates between them in short closed-loop slices in the order
A B B A A B ..., so drift that is steady over a repeat cancels out of the ratio. req/s is each
configuration's answers over its measured time; p50 is the median of its slices' p50s and p99
the largest of its slices' p99s.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from torchbay.benchmarks.loadplan import LoadPlan, LoadResult
from torchbay.benchmarks.runner import Ctx, serving, target, warm_and_measure
from torchbay.benchmarks.scenarios import Batching

__all__ = ["SLICES", "alternate", "order", "pooled"]

SLICES = 6  # slices per configuration and repeat


def order(labels: tuple[str, str], slices: int) -> list[str]:
    """A B B A A B ...: ``slices`` turns each, every pair of turns mirrored."""
    a, b = labels
    return [x for i in range(slices) for x in ((a, b) if i % 2 == 0 else (b, a))]


def pooled(results: list[LoadResult]) -> dict[str, float]:
    """One configuration's slices as one run (see the module docstring)."""
    window = sum(r.window_s for r in results)
    return {
        "req_s": sum(r.ok for r in results) / window if window > 0 else 0.0,
        "p50_ms": statistics.median(r.latency.p50_ms for r in results),
        "p99_ms": max(r.latency.p99_ms for r in results),
        "errors": float(sum(r.errors for r in results)),
    }


def alternate(
    ctx: Ctx,
    system: str,
    model: str,
    configs: dict[str, Batching],
    concurrency: int,
    run_dir: Path,
    slices: int = SLICES,
) -> dict[str, dict[str, float]]:
    """Serve ``model`` once per config (name -> batching) on one ``system`` server, warm each
    up, then measure them in alternating slices of ``ctx.duration_s / slices``; per name,
    :func:`pooled` metrics."""
    names = {name: model for name in configs}
    with serving(ctx, system, configs, run_dir, names=names) as server:
        targets = {name: target(ctx, server, name, model) for name in configs}
        plans = {
            name: LoadPlan(tgt, "closed", concurrency, duration_s=ctx.duration_s / slices)
            for name, tgt in targets.items()
        }
        for plan in plans.values():  # each warmed up once, before any slice
            warm_and_measure(ctx, plan)
        results: dict[str, list[LoadResult]] = {name: [] for name in configs}
        first, second = configs
        for name in order((first, second), slices):
            results[name].append(warm_and_measure(ctx, plans[name], warm=False))
    return {name: pooled(runs) for name, runs in results.items()}
