"""The rows of issue 15's table (``tables round2``): torchbay, TorchServe 0.12 when given, and
the row's ceiling, side by side in every round (overload: round2_overload.py).

Why slices (cnn-c1, batch-sweep): two runs one after the other differ by the host's drift, on a
shared host as much as the 3% the row judges. One server serves the cnn at batch 1 and batch 8
and the load alternates A B B A ..., so drift steady over a repeat cancels out of the ratio.
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path

from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, LoadResult
from torchbay.benchmarks.report import Ratio, RowResult, ratios
from torchbay.benchmarks.round2_overload import CNN_B8_W2, row_overload
from torchbay.benchmarks.runner import (
    ECHO,
    TORCHBAY,
    TORCHSERVE,
    Cell,
    Ctx,
    Row,
    beside_torchserve,
    closed,
    load_metrics,
    run_dir,
    run_inprocess,
    serving,
    systems_for,
    target,
    warm_and_measure,
)
from torchbay.benchmarks.scenarios import Batching, Goal, Scenario
from torchbay.server.serving.worker_env import worker_env

INPROCESS, INPROCESS_TUNED = "in-process", "in-process, tuned malloc"
TWO_MODELS = {"cnn_a": "cnn", "cnn_b": "cnn"}  # two names, one reference model (each its own mar)
TWO_MODELS_BATCHING = Batching(8, 10, 1)
TWO_MODEL_KEYS = ("alone_a", "alone_b", "together_a", "together_b")
SWEEP_CONCURRENCY = (2, 4, 8, 16)
CONFIGS = {"cnn_b1": Batching(1, 10, 1), "cnn_b8": Batching(8, 10, 1)}
SLICES = 6  # slices per configuration and repeat
WHEN = ("together", "alone")
LOAD_KEYS = ("req_s", "p50_ms", "p99_ms", "errors")
Measure = Callable[[int], dict[str, dict[str, float]]]


def _closed(ctx: Ctx, row: RowResult, run: Scenario, rnd: int) -> dict[str, dict[str, float]]:
    """A fresh server for ``run`` (named by its system), warm-up, measure its closed loop."""
    where = run_dir(ctx, row.key, run.name, f"r{rnd}")
    with serving(ctx, run.server, {run.model: run.batching}, where) as server:
        result = closed(ctx, target(ctx, server, run.model, run.model), run.concurrency or 1)
    if result.behind:
        row.notes.append(f"repeat {rnd} {run.name}: generator behind ({'; '.join(result.behind)})")
    return {run.name: load_metrics(result)}


def _closed_cells(ctx: Ctx, row: RowResult, runs: list[Scenario]) -> list[Cell]:
    estimate = ctx.warmup_s + ctx.duration_s + 3
    return [Cell((run.name,), partial(_closed, ctx, row, run), estimate) for run in runs]


def row_tiny(ctx: Ctx) -> Row:
    row = RowResult(
        "tiny-c16", "tiny, c=16, batch 8, 1 worker", f"c=16, {Batching(8, 5, 1).describe()}"
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE, ECHO)
    runs = [Scenario(s, s, "tiny", 16, 8, 5, 1) for s in systems]

    goals = [
        Goal("torchbay / bare ASGI", "", TORCHBAY, "req_s", 0.40, ECHO),
        *beside_torchserve(
            systems, Goal("torchbay / TorchServe", "", TORCHBAY, "req_s", None, TORCHSERVE)
        ),
    ]
    return Row(row, _closed_cells(ctx, row, runs), LOAD_KEYS, goals)


def row_cnn_c16(ctx: Ctx) -> Row:
    row = RowResult(
        "cnn-c16",
        "cnn, c=16, batch 8, 2 workers",
        f"c=16, {CNN_B8_W2.describe()}; in-process: 2 threads x 1 intra-op thread, batch 8",
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    flags = ("--batches", "8", "--streams", "2", "--seconds", str(ctx.duration_s))

    def limit(env: dict | None, rnd: int) -> dict[str, dict[str, float]]:
        """samples/s of two single-threaded loops of the cnn in one fresh process (``env``: its
        environment; the tuned one has the allocator settings torchbay's workers start with)."""
        name = INPROCESS if env is None else INPROCESS_TUNED
        return {name: {"req_s": run_inprocess(ctx, ("cnn",), *flags, env=env)["cnn"][8]}}

    cells = [
        Cell((INPROCESS,), partial(limit, None), ctx.duration_s + 3),
        Cell((INPROCESS_TUNED,), partial(limit, worker_env(os.environ)), ctx.duration_s + 3),
        *_closed_cells(ctx, row, [Scenario(s, s, "cnn", 16, 8, 10, 2) for s in systems]),
    ]

    bounds = {s: 0.90 if s == TORCHBAY else None for s in systems}
    goals = [
        *(
            Goal(f"{s} / in-process", "", s, "req_s", b, INPROCESS, "min")
            for s, b in bounds.items()
        ),
        Goal(f"torchbay / {INPROCESS_TUNED}", "", TORCHBAY, "req_s", None, INPROCESS_TUNED, "min"),
    ]
    return Row(row, cells, LOAD_KEYS, goals)


def order(labels: tuple[str, str], slices: int) -> list[str]:
    """A B B A A B ...: ``slices`` turns each, every pair of turns mirrored."""
    a, b = labels
    return [x for i in range(slices) for x in ((a, b) if i % 2 == 0 else (b, a))]


def pooled(results: list[LoadResult]) -> dict[str, float]:
    """One configuration's slices as one run: answers over measured time, the median of the
    slices' p50s, the largest of their p99s."""
    window = sum(r.window_s for r in results)
    return {
        "req_s": sum(r.ok for r in results) / window if window > 0 else 0.0,
        "p50_ms": statistics.median(r.latency.p50_ms for r in results),
        "p99_ms": max(r.latency.p99_ms for r in results),
        "errors": float(sum(r.errors for r in results)),
    }


def alternate(
    ctx: Ctx, system: str, model: str, configs: dict[str, Batching], concurrency: int, run_dir: Path
) -> dict[str, dict[str, float]]:
    """Serve ``model`` once per config (name -> batching) on one ``system`` server, warm each
    up, then measure them in alternating slices of ``ctx.duration_s / SLICES``; per name,
    :func:`pooled` metrics."""
    with serving(ctx, system, configs, run_dir, names=dict.fromkeys(configs, model)) as server:
        plans = {
            name: LoadPlan(
                target(ctx, server, name, model),
                "closed",
                concurrency,
                duration_s=ctx.duration_s / SLICES,
            )
            for name in configs
        }
        for plan in plans.values():  # each warmed up once, before any slice
            warm_and_measure(ctx, plan)
        results: dict[str, list[LoadResult]] = {name: [] for name in configs}
        for name in order(tuple(configs), SLICES):  # type: ignore[arg-type]
            results[name].append(warm_and_measure(ctx, plans[name], warm=False))
    return {name: pooled(runs) for name, runs in results.items()}


def _paired(key: str, title: str, concurrencies: tuple[int, ...], ctx: Ctx) -> Row:
    """batch 8 beside batch 1 (issue 15 item 1: never fewer req/s), a server per system and
    concurrency; bound 0.97 in every repeat for torchbay."""
    where = ", a server per concurrency" if len(concurrencies) > 1 else ""
    row = RowResult(
        key,
        title,
        f"c={', '.join(map(str, concurrencies))}{where}, delay 10 ms, 1 worker each; one "
        f"server serves both, alternating slices (b1 b8 b8 b1 ..., {SLICES} each)",
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    tags = {
        (s, c): s if len(concurrencies) == 1 else f"{s} c={c}"
        for s in systems
        for c in concurrencies
    }

    def measure(s: str, c: int, rnd: int) -> dict[str, dict[str, float]]:
        out = alternate(ctx, s, "cnn", CONFIGS, c, run_dir(ctx, key, s, f"c{c}", f"r{rnd}"))
        return {f"{tags[s, c]} {name[-2:]}": metrics for name, metrics in out.items()}

    cells = [
        Cell(
            (f"{tag} b8", f"{tag} b1"),
            partial(measure, s, c),
            2 * (ctx.warmup_s + ctx.duration_s) + 12,
        )
        for (s, c), tag in tags.items()
    ]

    bounds = {tag: 0.97 if s == TORCHBAY else None for (s, _), tag in tags.items()}
    goals = [
        Goal(f"{tag}: batch 8 / batch 1", "", f"{tag} b8", "req_s", b, f"{tag} b1", "min")
        for tag, b in bounds.items()
    ]
    return Row(row, cells, LOAD_KEYS, goals)


def row_batch_sweep(ctx: Ctx) -> Row:
    """The sweep at SWEEP_CONCURRENCY as it is when the row is built (a test narrows it)."""
    title = f"cnn, batch 8 vs batch 1 at c={SWEEP_CONCURRENCY[0]}..{SWEEP_CONCURRENCY[-1]}"
    return _paired("batch-sweep", title, SWEEP_CONCURRENCY, ctx)


def row_start(ctx: Ctx) -> Row:
    starts = max(ctx.starts, ctx.repeat)
    row = RowResult(
        "start",
        "start to first answer, tiny",
        "1 worker, batch 1; process start to the first 200 of POST /predictions/tiny; "
        f"{starts} starts per system",
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    body = ctx.assets.body["tiny"].read_bytes()

    def measure(s: str, rnd: int) -> dict[str, dict[str, float]]:
        with serving(ctx, s, {"tiny": Batching()}, run_dir(ctx, "start", s, f"r{rnd}")) as server:
            return {s: {"start_s": server.first_answer("/predictions/tiny", body)}}

    goals = [
        Goal("torchbay start s (median)", "", TORCHBAY, "start_s", 1.0),
        *beside_torchserve(
            systems, Goal("torchbay / TorchServe start", "", TORCHBAY, "start_s", None, TORCHSERVE)
        ),
    ]
    cells = [Cell((s,), partial(measure, s), 6.0) for s in systems]
    return Row(row, cells, ("start_s",), goals, rounds=starts)


def _two_models_once(ctx: Ctx, system: str, conc: int, rnd: int) -> dict[str, dict[str, float]]:
    """Each model alone (the other idle), then both at once from two generators."""
    models = dict.fromkeys(TWO_MODELS, TWO_MODELS_BATCHING)
    where = run_dir(ctx, "two-models", system, f"r{rnd}")
    with (
        serving(ctx, system, models, where, names=TWO_MODELS) as server,
        LoadGenerator(1) as second,
    ):
        targets = [target(ctx, server, n, "cnn") for n in TWO_MODELS]
        alone = [closed(ctx, t, conc).ok_per_s for t in targets]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            gens = (ctx.gen, second)
            runs = [
                pool.submit(closed, ctx, t, conc, g) for t, g in zip(targets, gens, strict=True)
            ]
            together = [f.result().ok_per_s for f in runs]
    return {system: dict(zip(TWO_MODEL_KEYS, alone + together, strict=True))}


def row_two_models(ctx: Ctx, concurrency: int = 8) -> Row:
    row = RowResult(
        "two-models",
        "two models on one host (cnn as cnn_a and cnn_b)",
        f"one server per system with both, {TWO_MODELS_BATCHING.describe()} each; "
        f"c={concurrency} per model; alone: the other model idle; together: both at once",
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    prefixes = {s: "" if s == TORCHBAY else f"{s}: " for s in systems}
    estimate = 3 * (ctx.warmup_s + ctx.duration_s) + 5
    cells = [Cell((s,), partial(_two_models_once, ctx, s, concurrency), estimate) for s in systems]

    def judge(r: RowResult) -> list[Ratio]:
        """Each model together over alone, and both: the host's budget holds for two models."""
        out = []
        for s, prefix in prefixes.items():
            together, alone = (
                [r.series(s, f"{w}_{x}") for x in "ab"] for w in ("together", "alone")
            )
            pairs = zip("ab", together, alone, strict=True)
            out += [Ratio(f"{prefix}cnn_{x} together / alone", ratios(t, a)) for x, t, a in pairs]
            both = [[x + y for x, y in zip(*w, strict=True)] for w in (together, alone)]
            bound = 0.90 if s == TORCHBAY else None
            out.append(Ratio(f"{prefix}combined together / alone", ratios(*both), bound))
        return out

    return Row(row, cells, TWO_MODEL_KEYS, judge=judge)


ROWS: dict[str, Callable[[Ctx], Row]] = {
    "tiny-c16": row_tiny,
    "cnn-c1": partial(_paired, "cnn-c1", "cnn, c=1, batch 8 vs batch 1", (1,)),
    "batch-sweep": row_batch_sweep,
    "cnn-c16": row_cnn_c16,
    "overload": row_overload,
    "start": row_start,
    "two-models": row_two_models,
}
