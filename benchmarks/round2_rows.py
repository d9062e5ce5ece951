"""The rows of issue 15's table (``tables round2``): torchbay, TorchServe 0.12 when given, and
the row's ceiling, side by side in every round (overload: round2_overload.py). Batch 8 beside
batch 1 runs on one server in alternating slices (A B B A ...): the host's drift over a repeat,
on a shared host as large as the 3% the row judges, cancels out of the ratio. The rows cnn-c16
(against the model in process), two-models and batch-sweep ran up to commit 1adc89d."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial

from torchbay.benchmarks import runner
from torchbay.benchmarks.loadgen import LoadPlan, LoadResult
from torchbay.benchmarks.report import RowResult
from torchbay.benchmarks.round2_overload import row_overload
from torchbay.benchmarks.runner import ECHO, TORCHBAY, TORCHSERVE, Cell, Ctx, Row
from torchbay.benchmarks.scenarios import Batching, Goal

CONFIGS = {"cnn_b1": Batching(1, 10, 1), "cnn_b8": Batching(8, 10, 1)}
SLICES = 6  # slices per configuration and repeat
LOAD_KEYS = ("req_s", "p50_ms", "p99_ms", "errors")
TINY = Batching(8, 5, 1)


def row_tiny(ctx: Ctx) -> Row:
    """A fresh server per system, warm-up, a closed loop at c=16."""
    row = RowResult("tiny-c16", "tiny, c=16, batch 8, 1 worker", f"c=16, {TINY.describe()}")
    systems = runner.systems_for(ctx, row, TORCHBAY, TORCHSERVE, ECHO)

    def measure(system: str, rnd: int) -> dict[str, dict[str, float]]:
        where = runner.run_dir(ctx, row.key, system, f"r{rnd}")
        with runner.serving(ctx, system, {"tiny": TINY}, where) as server:
            result = runner.closed(ctx, runner.target(ctx, server, "tiny", "tiny"), 16)
        if result.behind:
            behind = "; ".join(result.behind)
            row.notes.append(f"repeat {rnd} {system}: generator behind ({behind})")
        return {system: pooled([result])}

    estimate = ctx.warmup_s + ctx.duration_s + 3
    cells = [Cell((s,), partial(measure, s), estimate) for s in systems]
    vs_ts = Goal("torchbay / TorchServe", "", TORCHBAY, "req_s", None, TORCHSERVE)
    goals = [
        Goal("torchbay / bare ASGI", "", TORCHBAY, "req_s", 0.40, ECHO),
        *runner.beside_torchserve(systems, vs_ts),
    ]
    return Row(row, cells, LOAD_KEYS, goals)


def order(labels: tuple[str, str], slices: int) -> list[str]:
    """A B B A A B ...: ``slices`` turns each, every pair of turns mirrored."""
    a, b = labels
    return [x for i in range(slices) for x in ((a, b) if i % 2 == 0 else (b, a))]


def pooled(results: list[LoadResult]) -> dict[str, float]:
    """One configuration's runs (its slices, or one closed loop) as one run: answers over
    measured time, the median of the runs' p50s, the largest of their p99s."""
    window = sum(r.window_s for r in results)
    return {
        "req_s": sum(r.ok for r in results) / window if window > 0 else 0.0,
        "p50_ms": statistics.median(r.latency.p50_ms for r in results),
        "p99_ms": max(r.latency.p99_ms for r in results),
        "errors": float(sum(r.errors for r in results)),
    }


def row_cnn_c1(ctx: Ctx) -> Row:
    """batch 8 beside batch 1 at c=1 (issue 15 item 1: never fewer req/s), a server per system
    serving both, measured in alternating slices of ``ctx.duration_s / SLICES`` (each
    configuration warmed up once, before any slice); bound 0.97 in every repeat."""
    row = RowResult(
        "cnn-c1",
        "cnn, c=1, batch 8 vs batch 1",
        f"c=1, delay 10 ms, 1 worker each; one server serves both, alternating slices (b1 b8 b8 "
        f"b1 ..., {SLICES} each)",
    )
    systems = runner.systems_for(ctx, row, TORCHBAY, TORCHSERVE)

    def measure(s: str, rnd: int) -> dict[str, dict[str, float]]:
        where = runner.run_dir(ctx, row.key, s, "c1", f"r{rnd}")
        with runner.serving(ctx, s, CONFIGS, where, names=dict.fromkeys(CONFIGS, "cnn")) as server:
            plans = {}
            for name in CONFIGS:
                tgt = runner.target(ctx, server, name, "cnn")
                plans[name] = LoadPlan(tgt, "closed", 1, duration_s=ctx.duration_s / SLICES)
                runner.warm_and_measure(ctx, plans[name])
            slices: dict[str, list[LoadResult]] = {name: [] for name in CONFIGS}
            for name in order(tuple(CONFIGS), SLICES):  # type: ignore[arg-type]
                slices[name].append(runner.warm_and_measure(ctx, plans[name], warm=False))
        return {f"{s} {name[-2:]}": pooled(runs) for name, runs in slices.items()}

    estimate = 2 * (ctx.warmup_s + ctx.duration_s) + 12
    cells = [Cell((f"{s} b8", f"{s} b1"), partial(measure, s), estimate) for s in systems]
    bound = {TORCHBAY: 0.97}  # targets bind torchbay; TorchServe's figure is shown beside it
    goals = [
        Goal(f"{s}: batch 8 / batch 1", "", f"{s} b8", "req_s", bound.get(s), f"{s} b1", "min")
        for s in systems
    ]
    return Row(row, cells, LOAD_KEYS, goals)


def row_start(ctx: Ctx) -> Row:
    starts = max(ctx.starts, ctx.repeat)
    row = RowResult(
        "start",
        "start to first answer, tiny",
        "1 worker, batch 1; process start to the first 200 of POST /predictions/tiny; "
        f"{starts} starts per system",
    )
    systems = runner.systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    body = ctx.assets.body["tiny"].read_bytes()

    def measure(s: str, rnd: int) -> dict[str, dict[str, float]]:
        where = runner.run_dir(ctx, "start", s, f"r{rnd}")
        with runner.serving(ctx, s, {"tiny": Batching()}, where) as server:
            return {s: {"start_s": server.first_answer("/predictions/tiny", body)}}

    vs_ts = Goal("torchbay / TorchServe start", "", TORCHBAY, "start_s", None, TORCHSERVE)
    goals = [
        Goal("torchbay start s (median)", "", TORCHBAY, "start_s", 1.0),
        *runner.beside_torchserve(systems, vs_ts),
    ]
    cells = [Cell((s,), partial(measure, s), 6.0) for s in systems]
    return Row(row, cells, ("start_s",), goals, rounds=starts)


ROWS: dict[str, Callable[[Ctx], Row]] = {
    "tiny-c16": row_tiny,
    "cnn-c1": row_cnn_c1,
    "overload": row_overload,
    "start": row_start,
}
