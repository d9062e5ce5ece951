"""The rows of issue 15's table, each measured ``ctx.repeat`` times side by side (torchbay,
TorchServe 0.12 when given, and the row's ceiling in the same repeat), as :class:`RowResult` s.

A system that fails in a repeat leaves NaN figures and its error in ``errors``; the other systems
and rows still run. ``ROWS`` give each row's expected seconds per repeat for the ETA. The paired
batch 8 / batch 1 rows (cnn-c1, batch-sweep) live in round2_sweep.py.
"""

from __future__ import annotations

import concurrent.futures
import os

import psutil

from torchbay.benchmarks import procstat, round2_overload, round2_sweep
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import START_MARGIN_S, LoadGenerator, LoadPlan
from torchbay.benchmarks.loadplan import TIMEOUT
from torchbay.benchmarks.report import Ratio, RowResult, failed, median, ratios
from torchbay.benchmarks.runner import (
    ECHO,
    TORCHBAY,
    TORCHSERVE,
    Ctx,
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


def _closed_row(ctx: Ctx, row: RowResult, runs: list[Scenario], rep: int) -> None:
    """Each scenario (named by its system): a fresh server, warm-up, measure."""
    for run in runs:
        label, run_dir = run.name, ctx.out_dir / "runs" / f"{row.key}-{run.name}-r{rep}"
        try:
            with serving(ctx, run.server, {run.model: run.batching}, run_dir) as server:
                tgt = target(ctx, server, run.model, run.model)
                result = warm_and_measure(ctx, run.plan(tgt, ctx.duration_s))
            row.add(label, load_metrics(result))
            if result.behind:
                row.notes.append(
                    f"repeat {rep} {label}: generator behind ({'; '.join(result.behind)})"
                )
        except (BenchError, psutil.Error) as exc:
            failed(row, label, rep, exc, ("req_s", "p50_ms", "p99_ms", "errors"))
        ctx.progress(
            f"{row.key} repeat {rep}: {label} {row.series(label, 'req_s')[-1]:,.0f} req/s",
            ctx.warmup_s + ctx.duration_s + 3,
        )


def row_tiny(ctx: Ctx) -> RowResult:
    b = Batching(8, 5, 1)
    row = RowResult("tiny-c16", "tiny, c=16, batch 8, 1 worker", f"c=16, {b.describe()}")
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE, ECHO)
    for rep in range(1, ctx.repeat + 1):
        _closed_row(ctx, row, [Scenario(s, s, "tiny", 16, 8, 5, 1) for s in systems], rep)
    tb = row.series(TORCHBAY, "req_s")
    row.ratios.append(Ratio("torchbay / bare ASGI", ratios(tb, row.series(ECHO, "req_s")), 0.40))
    if TORCHSERVE in systems:
        row.ratios.append(
            Ratio("torchbay / TorchServe", ratios(tb, row.series(TORCHSERVE, "req_s")))
        )
    return row


def inprocess_limit(ctx: Ctx, batch: int, streams: int, env: dict | None = None) -> float:
    """samples/s of ``streams`` single-threaded loops of the cnn in one fresh process (``env``:
    its environment, None: ours), for ``duration_s``."""
    flags = ("--batches", str(batch), "--streams", str(streams), "--seconds", str(ctx.duration_s))
    return run_inprocess(ctx, ("cnn",), *flags, env=env)["cnn"][batch]


def row_cnn_c16(ctx: Ctx) -> RowResult:
    b = CNN_B8_W2
    row = RowResult(
        "cnn-c16",
        "cnn, c=16, batch 8, 2 workers",
        f"c=16, {b.describe()}; in-process: 2 threads x 1 intra-op thread, batch 8",
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    for rep in range(1, ctx.repeat + 1):
        for name, env in ((INPROCESS, None), (INPROCESS_TUNED, worker_env(os.environ))):
            try:  # the tuned loop has the allocator settings torchbay's workers start with
                row.add(name, {"req_s": inprocess_limit(ctx, 8, 2, env)})
            except BenchError as exc:
                failed(row, name, rep, exc, ("req_s",))
        ctx.progress(f"{row.key} repeat {rep}: in-process limit", ctx.duration_s + 3)
        _closed_row(ctx, row, [Scenario(s, s, "cnn", 16, 8, 10, 2) for s in systems], rep)
    limit = row.series(INPROCESS, "req_s")
    for s in systems:
        bound = 0.90 if s == TORCHBAY else None
        row.ratios.append(
            Ratio(f"{s} / in-process", ratios(row.series(s, "req_s"), limit), bound, ">=", "min")
        )
    tuned = ratios(row.series(TORCHBAY, "req_s"), row.series(INPROCESS_TUNED, "req_s"))
    row.ratios.append(Ratio(f"torchbay / {INPROCESS_TUNED}", tuned, None, ">=", "min"))
    return row


def overload_once(ctx: Ctx, system: str, rep: int, sweep: bool) -> tuple[dict, list[dict]]:
    """Capacity (closed loop, c=16), then one open-loop run: 0.5x, 4x, 0.5x capacity for
    ``duration_s`` each (at most 256 connections); with ``sweep``, one open-loop run per factor."""
    props = {"job_queue_size": JOB_QUEUE_SIZE, "max_queue_delay_ms": QUEUE_DELAY_MS}
    run_dir = ctx.out_dir / "runs" / f"overload-{system}-r{rep}"
    with serving(ctx, system, {"cnn": CNN_B8_W2}, run_dir, props=props) as server:
        tgt = target(ctx, server, "cnn", "cnn")
        pids = (server.proc.pid, [p.pid for p in ctx.gen.procs])  # type: ignore[union-attr]
        opens = procstat.closed_run_opens(ctx.warmup_s)
        at_capacity = procstat.Window.within(pids, opens, ctx.duration_s)
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
            timeout_s=round2_overload.LATE_S,
            max_connections=MAX_CONNECTIONS,
            timeline=True,
        )
        phase = procstat.Window(*pids, START_MARGIN_S + d, START_MARGIN_S + 2 * d)  # the 4x
        result = ctx.gen.run(plan)
        lost = result.statuses.get(TIMEOUT, 0)
        outcome = round2_overload.analyse(result.timeline, capacity, steps, lost, result.sent)
        good, served = outcome.overload.goodput_per_s * d, capacity * at_capacity.span_s
        cpu = procstat.figures(at_capacity.seconds(), served, phase.seconds(), d, good)
        behind = result.behind
        points = []
        for factor in SWEEP_FACTORS if sweep else ():
            rate = factor * capacity
            plan = LoadPlan(
                tgt,
                "open",
                rate=rate,
                duration_s=d,
                warmup_s=ctx.warmup_s,  # steady state: the window opens on a running load
                timeline=True,
                timeout_s=round2_overload.LATE_S,
                max_connections=MAX_CONNECTIONS,
            )
            res = ctx.gen.run(plan)
            items = round2_overload.answers(res.timeline)
            stats = round2_overload.phase_stats(
                round2_overload.in_phase(items, 0.0, d),
                d,
                rate,
                round2_overload.answered_ok_in(items, 0.0, d),
            )
            points.append({"factor": factor, **stats.as_dict(), "generator_behind": res.behind})
    detail = {**outcome.as_dict(), "generator_behind": behind}
    return {"metrics": {**outcome.metrics(), **cpu}, "detail": detail}, points


OVERLOAD_KEYS = (
    "capacity_req_s",
    "goodput_ratio",
    "admitted_p99_ms",
    "unanswered_10s",
    "503_overload",
    "503_recovery",
    "recovery_s",
    *procstat.FIGURES,
)


def row_overload(ctx: Ctx) -> RowResult:
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
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    row.extra["sweep"], row.extra["detail"] = {}, {}
    for rep in range(1, ctx.repeat + 1):
        for s in systems:
            try:
                out, points = overload_once(ctx, s, rep, sweep=rep == 1)
                row.add(s, out["metrics"])
                row.extra["detail"].setdefault(s, []).append(out["detail"])
                if points:
                    row.extra["sweep"][s] = points
            except (BenchError, psutil.Error) as exc:
                failed(row, s, rep, exc, OVERLOAD_KEYS)
            est = ctx.warmup_s + 4 * ctx.duration_s + 8 + (4 * ctx.duration_s if rep == 1 else 0)
            ctx.progress(
                f"overload repeat {rep}: {s} goodput/capacity "
                f"{row.series(s, 'goodput_ratio')[-1]:.2f}",
                est,
            )
    for s in systems[:1]:
        row.ratios += [
            Ratio(f"{s}: goodput / capacity", row.series(s, "goodput_ratio"), 0.90),
            Ratio(
                f"{s}: admitted p99 ms (bound: queue delay + 2x pre-overload p99)",
                row.series(s, "admitted_p99_ms"),
                QUEUE_DELAY_MS + 2 * median(row.series(s, "pre_p99_ms")),
                "<=",
            ),
            Ratio(
                f"{s}: unanswered 10 s after the scheduled send",
                row.series(s, "unanswered_10s"),
                0,
                "<=",
                "max",
            ),
            Ratio(
                f"{s}: seconds until normal after the overload (n/a: not normal by the end)",
                row.series(s, "recovery_s"),
                RECOVERY_BOUND_S,
                "<=",
            ),
        ]
    if TORCHSERVE in systems:
        row.ratios.append(
            Ratio("TorchServe: goodput / capacity", row.series(TORCHSERVE, "goodput_ratio"))
        )
    return row


def row_start(ctx: Ctx) -> RowResult:
    row = RowResult(
        "start",
        "start to first answer, tiny",
        f"1 worker, batch 1; process start to the first 200 of POST /predictions/tiny; "
        f"{max(ctx.starts, ctx.repeat)} starts per system",
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    body = ctx.assets.body["tiny"].read_bytes()
    for rep in range(1, max(ctx.starts, ctx.repeat) + 1):
        for s in systems:
            try:
                with serving(
                    ctx, s, {"tiny": Batching()}, ctx.out_dir / "runs" / f"start-{s}-r{rep}"
                ) as server:
                    row.add(s, {"start_s": server.first_answer("/predictions/tiny", body)})
            except (BenchError, psutil.Error) as exc:
                failed(row, s, rep, exc, ("start_s",))
            ctx.progress(f"start repeat {rep}: {s} {row.series(s, 'start_s')[-1]:.2f} s", 6)
    row.ratios.append(
        Ratio("torchbay start s (median)", row.series(TORCHBAY, "start_s"), 1.0, "<=")
    )
    if TORCHSERVE in systems:
        row.ratios.append(
            Ratio(
                "torchbay / TorchServe start",
                ratios(row.series(TORCHBAY, "start_s"), row.series(TORCHSERVE, "start_s")),
            )
        )
    return row


def row_two_models(ctx: Ctx, concurrency: int = 8) -> RowResult:
    b = TWO_MODELS_BATCHING
    row = RowResult(
        "two-models",
        "two models on one host (cnn as cnn_a and cnn_b)",
        f"one server per system with both, {b.describe()} each; c={concurrency} per model; "
        "alone: one model driven, the other idle; together: both at once; the 0.90 target is "
        "torchbay's (its host budget), TorchServe's figures are the reference",
    )
    systems = systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    keys = ("alone_a", "alone_b", "together_a", "together_b")
    with LoadGenerator(1) as second:
        for rep in range(1, ctx.repeat + 1):
            for system in systems:
                try:
                    row.add(system, _two_models_once(ctx, system, concurrency, rep, second))
                except (BenchError, psutil.Error) as exc:
                    failed(row, system, rep, exc, keys)
                ctx.progress(
                    f"two models repeat {rep}: {system}", 3 * (ctx.warmup_s + ctx.duration_s) + 5
                )
    s = row.series
    for system in systems:
        alone = [a + b for a, b in zip(s(system, "alone_a"), s(system, "alone_b"), strict=True)]
        together = [
            a + b for a, b in zip(s(system, "together_a"), s(system, "together_b"), strict=True)
        ]
        prefix = "" if system == TORCHBAY else f"{system}: "
        row.ratios += [
            Ratio(
                f"{prefix}cnn_a together / alone",
                ratios(s(system, "together_a"), s(system, "alone_a")),
            ),
            Ratio(
                f"{prefix}cnn_b together / alone",
                ratios(s(system, "together_b"), s(system, "alone_b")),
            ),
            Ratio(
                f"{prefix}combined together / alone",
                ratios(together, alone),
                0.90 if system == TORCHBAY else None,
            ),
        ]
    return row


def _two_models_once(
    ctx: Ctx, system: str, conc: int, rep: int, second: LoadGenerator
) -> dict[str, float]:
    """Each model alone (the other idle), then both at once from two generators."""
    run_dir = ctx.out_dir / "runs" / f"two-models-{system}-r{rep}"
    names = TWO_MODELS
    models = dict.fromkeys(names, TWO_MODELS_BATCHING)
    with serving(ctx, system, models, run_dir, names=names) as server:
        ta, tb = (target(ctx, server, n, "cnn") for n in names)
        alone_a = closed(ctx, ta, conc).ok_per_s
        alone_b = closed(ctx, tb, conc).ok_per_s
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            fa = pool.submit(closed, ctx, ta, conc, ctx.gen)
            fb = pool.submit(closed, ctx, tb, conc, second)
            together_a, together_b = fa.result().ok_per_s, fb.result().ok_per_s
    return {
        "alone_a": alone_a,
        "alone_b": alone_b,
        "together_a": together_a,
        "together_b": together_b,
    }


ROWS = {
    "tiny-c16": (row_tiny, lambda c: 3 * (c.warmup_s + c.duration_s + 4)),
    "cnn-c1": (round2_sweep.row_cnn_c1, lambda c: 2 * round2_sweep.sweep_estimate_s(c)),
    "batch-sweep": (
        round2_sweep.row_batch_sweep,
        lambda c: 2 * round2_sweep.sweep_estimate_s(c, len(round2_sweep.SWEEP_CONCURRENCY)),
    ),
    "cnn-c16": (row_cnn_c16, lambda c: 4 * (c.warmup_s + c.duration_s + 4)),
    "overload": (row_overload, lambda c: 2 * (c.warmup_s + 4 * c.duration_s + 8)),
    "start": (row_start, lambda c: 12.0 * max(c.starts, c.repeat) / c.repeat),
    "two-models": (row_two_models, lambda c: 2 * (3 * (c.warmup_s + c.duration_s) + 5)),
}
SWEEP_ESTIMATE = {"overload": lambda c: 2 * 4 * (c.warmup_s + c.duration_s)}
