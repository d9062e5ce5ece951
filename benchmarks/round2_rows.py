"""The rows of issue 15's table (``tables round2``): torchbay, TorchServe 0.12 when given, and
the row's ceiling, side by side in every round; each row's special measurement is its cells'
``measure`` (the overload phases, the alternating slices, the start time, two models).

Why slices (cnn-c1, batch-sweep): measured one after the other, two runs of the same server
differ by the host's drift, on a shared 2-core host as much as the 3% the row judges. One server
serves the cnn twice (batch 1 and batch 8, each its own archive copy and worker) and closed-loop
load alternates between them, A B B A A B ..., so drift steady over a repeat cancels out of the
ratio. req/s is a configuration's answers over its measured time; p50 the median of its slices'
p50s, p99 the largest of their p99s.
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path

from torchbay.benchmarks import procstat
from torchbay.benchmarks import round2_overload as over
from torchbay.benchmarks.loadgen import START_MARGIN_S, LoadGenerator, LoadPlan, LoadResult
from torchbay.benchmarks.loadplan import TIMEOUT
from torchbay.benchmarks.report import Ratio, RowResult, median, ratios
from torchbay.benchmarks.runner import (
    ECHO,
    TORCHBAY,
    TORCHSERVE,
    Cell,
    Ctx,
    Row,
    closed,
    load_metrics,
    run_inprocess,
    serving,
    systems_for,
    target,
    warm_and_measure,
)
from torchbay.benchmarks.scenarios import Batching, Scenario
from torchbay.server.serving.worker_env import worker_env

OVERLOAD_FACTOR, RECOVERY_FACTOR = 4.0, 0.5
SWEEP_FACTORS = (0.5, 1.0, 2.0, 4.0)
MAX_CONNECTIONS = 256
QUEUE_DELAY_MS = 200
JOB_QUEUE_SIZE = 100
INPROCESS, INPROCESS_TUNED = "in-process", "in-process, tuned malloc"
RECOVERY_BOUND_S = 5.0
CNN_B8_W2 = Batching(8, 10, 2)
TWO_MODELS = {"cnn_a": "cnn", "cnn_b": "cnn"}  # two names, one reference model (each its own mar)
TWO_MODELS_BATCHING = Batching(8, 10, 1)
SWEEP_CONCURRENCY = (2, 4, 8, 16)
CONFIGS = {"cnn_b1": Batching(1, 10, 1), "cnn_b8": Batching(8, 10, 1)}
SLICES = 6  # slices per configuration and repeat
LOAD_KEYS = ("req_s", "p50_ms", "p99_ms", "errors")
Measure = Callable[[int], dict[str, dict[str, float]]]


def _run_dir(ctx: Ctx, *parts: object) -> Path:
    return ctx.out_dir / "runs" / "-".join(map(str, parts))


def _closed(ctx: Ctx, row: RowResult, run: Scenario, rnd: int) -> dict[str, dict[str, float]]:
    """A fresh server for ``run`` (named by its system), warm-up, measure."""
    with serving(
        ctx, run.server, {run.model: run.batching}, _run_dir(ctx, row.key, run.name, f"r{rnd}")
    ) as server:
        result = warm_and_measure(
            ctx, run.plan(target(ctx, server, run.model, run.model), ctx.duration_s)
        )
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

    def judge(r: RowResult) -> list[Ratio]:
        tb = r.series(TORCHBAY, "req_s")
        out = [Ratio("torchbay / bare ASGI", ratios(tb, r.series(ECHO, "req_s")), 0.40)]
        if TORCHSERVE in systems:
            out.append(Ratio("torchbay / TorchServe", ratios(tb, r.series(TORCHSERVE, "req_s"))))
        return out

    return Row(row, _closed_cells(ctx, row, runs), LOAD_KEYS, judge)


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

    def judge(r: RowResult) -> list[Ratio]:
        limit = r.series(INPROCESS, "req_s")
        out = [
            Ratio(
                f"{s} / in-process",
                ratios(r.series(s, "req_s"), limit),
                0.90 if s == TORCHBAY else None,
                ">=",
                "min",
            )
            for s in systems
        ]
        tuned = ratios(r.series(TORCHBAY, "req_s"), r.series(INPROCESS_TUNED, "req_s"))
        return [*out, Ratio(f"torchbay / {INPROCESS_TUNED}", tuned, None, ">=", "min")]

    return Row(row, cells, LOAD_KEYS, judge)


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
        f"server serves both, measured in alternating slices (b1 b8 b8 b1 ..., {SLICES} per "
        "configuration)",
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    tags = {
        (s, c): s if len(concurrencies) == 1 else f"{s} c={c}"
        for s in systems
        for c in concurrencies
    }

    def measure(s: str, c: int, rnd: int) -> dict[str, dict[str, float]]:
        out = alternate(ctx, s, "cnn", CONFIGS, c, _run_dir(ctx, key, s, f"c{c}", f"r{rnd}"))
        return {f"{tags[s, c]} {name[-2:]}": metrics for name, metrics in out.items()}

    cells = [
        Cell(
            (f"{tag} b8", f"{tag} b1"),
            partial(measure, s, c),
            2 * (ctx.warmup_s + ctx.duration_s) + 12,
        )
        for (s, c), tag in tags.items()
    ]

    def judge(r: RowResult) -> list[Ratio]:
        return [
            Ratio(
                f"{tag}: batch 8 / batch 1",
                ratios(r.series(f"{tag} b8", "req_s"), r.series(f"{tag} b1", "req_s")),
                0.97 if s == TORCHBAY else None,
                ">=",
                "min",
            )
            for (s, _), tag in tags.items()
        ]

    return Row(row, cells, LOAD_KEYS, judge)


def _sweep_point(ctx: Ctx, tgt: object, capacity: float, factor: float) -> dict:
    """An open-loop run at ``factor`` x capacity, warmed up (the window opens on running load)."""
    d, rate = ctx.duration_s, factor * capacity
    plan = LoadPlan(
        tgt,
        "open",
        rate=rate,
        duration_s=d,
        warmup_s=ctx.warmup_s,
        timeline=True,  # type: ignore[arg-type]
        timeout_s=over.LATE_S,
        max_connections=MAX_CONNECTIONS,
    )
    res = ctx.gen.run(plan)
    items = over.answers(res.timeline)
    stats = over.phase_stats(
        over.in_phase(items, 0.0, d), d, rate, over.answered_ok_in(items, 0.0, d)
    )
    return {"factor": factor, **stats.as_dict(), "generator_behind": res.behind}


def overload_once(ctx: Ctx, row: RowResult, system: str, rnd: int) -> dict[str, dict[str, float]]:
    """Capacity (closed loop, c=16), then one open-loop run: 0.5x, 4x, 0.5x capacity for
    ``duration_s`` each (at most 256 connections); in round 1 also one open-loop run per
    SWEEP_FACTORS (the plot). The phases' detail goes to ``row.extra``."""
    props = {"job_queue_size": JOB_QUEUE_SIZE, "max_queue_delay_ms": QUEUE_DELAY_MS}
    with serving(
        ctx, system, {"cnn": CNN_B8_W2}, _run_dir(ctx, "overload", system, f"r{rnd}"), props=props
    ) as server:
        tgt = target(ctx, server, "cnn", "cnn")
        pids = (server.proc.pid, [p.pid for p in ctx.gen.procs])  # type: ignore[union-attr]
        at_capacity = procstat.Window.within(
            pids, procstat.closed_run_opens(ctx.warmup_s), ctx.duration_s
        )
        capacity = closed(ctx, tgt, 16).ok_per_s
        d = ctx.duration_s
        steps = (
            (d, RECOVERY_FACTOR * capacity),
            (d, OVERLOAD_FACTOR * capacity),
            (d, RECOVERY_FACTOR * capacity),
        )
        plan = LoadPlan(
            tgt,
            "open",
            rate=max(r for _, r in steps),
            steps=steps,
            duration_s=3 * d,
            timeout_s=over.LATE_S,
            max_connections=MAX_CONNECTIONS,
            timeline=True,
        )
        phase = procstat.Window(*pids, START_MARGIN_S + d, START_MARGIN_S + 2 * d)  # the 4x
        result = ctx.gen.run(plan)
        lost = result.statuses.get(TIMEOUT, 0)
        outcome = over.analyse(result.timeline, capacity, steps, lost, result.sent)
        good, served = outcome.overload.goodput_per_s * d, capacity * at_capacity.span_s
        cpu = procstat.figures(at_capacity.seconds(), served, phase.seconds(), d, good)
        if rnd == 1:
            row.extra["sweep"][system] = [
                _sweep_point(ctx, tgt, capacity, f) for f in SWEEP_FACTORS
            ]
    detail = {**outcome.as_dict(), "generator_behind": result.behind}
    row.extra["detail"].setdefault(system, []).append(detail)
    return {system: {**outcome.metrics(), **cpu}}


OVERLOAD_KEYS = (
    "goodput_ratio",
    "capacity_req_s",
    "admitted_p99_ms",
    "unanswered_10s",
    "503_overload",
    "503_recovery",
    "recovery_s",
    *procstat.FIGURES,
)


def row_overload(ctx: Ctx) -> Row:
    row = RowResult(
        "overload",
        "cnn, 4x overload, then recovery at 0.5x",
        f"{CNN_B8_W2.describe()}; job_queue_size {JOB_QUEUE_SIZE}; torchbay "
        f"max_queue_delay_ms {QUEUE_DELAY_MS} (TorchServe has none); capacity: closed "
        f"loop c=16; then open loop 0.5x / 4x / 0.5x capacity, {ctx.duration_s:g} s "
        f"each, 48 KiB bodies, <= {MAX_CONNECTIONS} connections, latency from the "
        "scheduled send; goodput = 200s answered within the overload phase per second; "
        "normal = p99 of each 1 s window <= 2x the pre-overload p99; sweep (repeat 1 only): "
        "open loop at 0.5/1/2/4x capacity, warm-up then the same window each",
        extra={"sweep": {}, "detail": {}},
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    estimate = (
        ctx.warmup_s + 4 * ctx.duration_s + 8 + 4 * (ctx.warmup_s + ctx.duration_s) / ctx.repeat
    )
    cells = [Cell((s,), partial(overload_once, ctx, row, s), estimate) for s in systems]

    def judge(r: RowResult) -> list[Ratio]:
        s = TORCHBAY
        out = [
            Ratio(f"{s}: goodput / capacity", r.series(s, "goodput_ratio"), 0.90),
            Ratio(
                f"{s}: admitted p99 ms (bound: queue delay + 2x pre-overload p99)",
                r.series(s, "admitted_p99_ms"),
                QUEUE_DELAY_MS + 2 * median(r.series(s, "pre_p99_ms")),
                "<=",
            ),
            Ratio(
                f"{s}: unanswered 10 s after the scheduled send",
                r.series(s, "unanswered_10s"),
                0,
                "<=",
                "max",
            ),
            Ratio(
                f"{s}: seconds until normal after the overload (n/a: not normal by the end)",
                r.series(s, "recovery_s"),
                RECOVERY_BOUND_S,
                "<=",
            ),
        ]
        if TORCHSERVE in systems:
            out.append(
                Ratio("TorchServe: goodput / capacity", r.series(TORCHSERVE, "goodput_ratio"))
            )
        return out

    return Row(row, cells, OVERLOAD_KEYS, judge)


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
        with serving(ctx, s, {"tiny": Batching()}, _run_dir(ctx, "start", s, f"r{rnd}")) as server:
            return {s: {"start_s": server.first_answer("/predictions/tiny", body)}}

    def judge(r: RowResult) -> list[Ratio]:
        tb = r.series(TORCHBAY, "start_s")
        out = [Ratio("torchbay start s (median)", tb, 1.0, "<=")]
        if TORCHSERVE in systems:
            out.append(
                Ratio("torchbay / TorchServe start", ratios(tb, r.series(TORCHSERVE, "start_s")))
            )
        return out

    return Row(
        row, [Cell((s,), partial(measure, s), 6.0) for s in systems], ("start_s",), judge, starts
    )


def _two_models_once(ctx: Ctx, system: str, conc: int, rnd: int) -> dict[str, dict[str, float]]:
    """Each model alone (the other idle), then both at once from two generators."""
    models = dict.fromkeys(TWO_MODELS, TWO_MODELS_BATCHING)
    run_dir = _run_dir(ctx, "two-models", system, f"r{rnd}")
    with (
        serving(ctx, system, models, run_dir, names=TWO_MODELS) as server,
        LoadGenerator(1) as second,
    ):
        ta, tb = (target(ctx, server, n, "cnn") for n in TWO_MODELS)
        alone_a = closed(ctx, ta, conc).ok_per_s
        alone_b = closed(ctx, tb, conc).ok_per_s
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            fa = pool.submit(closed, ctx, ta, conc, ctx.gen)
            fb = pool.submit(closed, ctx, tb, conc, second)
            together_a, together_b = fa.result().ok_per_s, fb.result().ok_per_s
    figures = (alone_a, alone_b, together_a, together_b)
    return {
        system: dict(zip(("alone_a", "alone_b", "together_a", "together_b"), figures, strict=True))
    }


def row_two_models(ctx: Ctx, concurrency: int = 8) -> Row:
    row = RowResult(
        "two-models",
        "two models on one host (cnn as cnn_a and cnn_b)",
        f"one server per system with both, {TWO_MODELS_BATCHING.describe()} each; "
        f"c={concurrency} per model; alone: one model driven, the other idle; together: both "
        "at once; the 0.90 target is torchbay's (its host budget), TorchServe's figures are "
        "the reference",
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    estimate = 3 * (ctx.warmup_s + ctx.duration_s) + 5
    cells = [Cell((s,), partial(_two_models_once, ctx, s, concurrency), estimate) for s in systems]

    def judge(r: RowResult) -> list[Ratio]:
        out = []
        for system in systems:
            a, b = r.series(system, "together_a"), r.series(system, "together_b")
            alone_a, alone_b = r.series(system, "alone_a"), r.series(system, "alone_b")
            prefix = "" if system == TORCHBAY else f"{system}: "
            out += [
                Ratio(f"{prefix}cnn_a together / alone", ratios(a, alone_a)),
                Ratio(f"{prefix}cnn_b together / alone", ratios(b, alone_b)),
                Ratio(
                    f"{prefix}combined together / alone",
                    ratios(
                        [x + y for x, y in zip(a, b, strict=True)],
                        [x + y for x, y in zip(alone_a, alone_b, strict=True)],
                    ),
                    0.90 if system == TORCHBAY else None,
                ),
            ]
        return out

    return Row(row, cells, ("alone_a", "alone_b", "together_a", "together_b"), judge)


ROWS: dict[str, Callable[[Ctx], Row]] = {
    "tiny-c16": row_tiny,
    "cnn-c1": partial(_paired, "cnn-c1", "cnn, c=1, batch 8 vs batch 1", (1,)),
    "batch-sweep": partial(
        _paired, "batch-sweep", "cnn, batch 8 vs batch 1 at c=2..16", SWEEP_CONCURRENCY
    ),
    "cnn-c16": row_cnn_c16,
    "overload": row_overload,
    "start": row_start,
    "two-models": row_two_models,
}
