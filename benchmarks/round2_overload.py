"""Round two's overload row: capacity, then 0.5x / 4x / 0.5x capacity in one open-loop run,
judged from :attr:`LoadResult.timeline` (start s, latency s from the SCHEDULED send, status or
-1 per request). After the overload, latency is back to normal once every 1 s window of the
recovery phase to its end has a p99 within :data:`NORMAL_FACTOR` x the pre-overload p99."""

from __future__ import annotations

import array
import math
from functools import partial
from itertools import accumulate, takewhile
from typing import Any, NamedTuple

from torchbay.benchmarks import procstat, runner
from torchbay.benchmarks.loadgen import START_MARGIN_S, LoadPlan
from torchbay.benchmarks.loadplan import TIMEOUT, Target
from torchbay.benchmarks.report import Ratio, RowResult, median
from torchbay.benchmarks.runner import TORCHBAY, TORCHSERVE
from torchbay.benchmarks.scenarios import Batching, Goal
from torchbay.benchmarks.stats import percentile

NORMAL_FACTOR, WINDOW_S = 2.0, 1.0
LATE_S = 10.0  # an answer later than this after its scheduled send counts as unanswered
PHASES = {"pre": 0.5, "overload": 4.0, "recovery": 0.5}  # each phase's rate, x capacity
SWEEP_FACTORS = (0.5, 1.0, 2.0, 4.0)
MAX_CONNECTIONS, QUEUE_DELAY_MS, JOB_QUEUE_SIZE = 256, 200, 100
RECOVERY_BOUND_S = 5.0
CNN_B8_W2 = Batching(8, 10, 2)
Steps = tuple[tuple[float, float], ...]  # an open loop's (seconds, rate) phases


class Answer(NamedTuple):
    start: float
    latency: float
    status: int


def answers(timeline: bytes) -> list[Answer]:
    """The timeline's (start, latency, status) triples."""
    flat = array.array("d", timeline)
    return [Answer(flat[i], flat[i + 1], int(flat[i + 2])) for i in range(0, len(flat) - 2, 3)]


def p99_ms(items: list[Answer]) -> float:
    return 1e3 * percentile([a.latency for a in items], 99.0)


def phase_stats(items: list[Answer], begin: float, end: float, offered: float) -> dict[str, float]:
    """The answers scheduled in [begin, end) as the client saw them: ``answered`` counts HTTP
    answers (a connection error is unanswered), ``late`` those more than LATE_S after the
    scheduled send; goodput the 200s answered within the phase (whenever sent) per second;
    ``admitted_p99_ms`` the p99 of the 200s, ``p99_ms`` of every answer."""
    scheduled, seconds = [a for a in items if begin <= a.start < end], end - begin
    ok = [a for a in scheduled if a.status == 200]
    good = sum(a.status == 200 and begin <= a.start + a.latency < end for a in items)
    return {
        "offered_per_s": offered,
        "answered": sum(a.status >= 0 for a in scheduled),
        "ok": len(ok),
        "rejected_503": sum(a.status == 503 for a in scheduled),
        "other_errors": sum(a.status >= 0 and a.status not in (200, 503) for a in scheduled),
        "late": sum(a.latency > LATE_S for a in scheduled),
        "goodput_per_s": good / seconds if seconds else math.nan,
        "admitted_p99_ms": p99_ms(ok),
        "p99_ms": p99_ms(scheduled),
    }


def recovery_seconds(windows: list[float], normal_ms: float) -> float:
    """Seconds from the phase start until every later window is normal (<= ``normal_ms``);
    NaN when the last window is not (or nothing was measured)."""
    normal = [math.isfinite(normal_ms) and w <= normal_ms for w in windows]  # NaN: not normal
    tail = sum(1 for _ in takewhile(bool, reversed(normal)))
    return (len(normal) - tail) * WINDOW_S if tail else math.nan


def analyse(timeline: bytes, capacity: float, steps: Steps, timeouts: int, sent: int) -> dict:
    """``steps`` are the plan's (seconds, rate) of each of :data:`PHASES`; ``timeouts``: requests
    the generator gave up on (not in the timeline). Each phase's :func:`phase_stats`,
    ``unanswered`` (timeouts and connection errors over the whole run), the recovery phase's
    window p99s and ``recovery_s``."""
    items = answers(timeline)
    edges = [0.0, *accumulate(seconds for seconds, _ in steps)]
    out: dict[str, Any] = {"capacity_per_s": capacity}
    for i, (name, (_, rate)) in enumerate(zip(PHASES, steps, strict=True)):
        out[name] = phase_stats(items, edges[i], edges[i + 1], rate)
    starts = [edges[2] + i * WINDOW_S for i in range(int(steps[2][0] / WINDOW_S + 1e-9))]
    windows = [p99_ms([a for a in items if t <= a.start < t + WINDOW_S]) for t in starts]
    normal = NORMAL_FACTOR * out["pre"]["p99_ms"]
    return out | {
        "unanswered": timeouts + sum(a.status < 0 for a in items),
        "sent": sent,
        "recovery_windows_p99_ms": windows,
        "normal_p99_ms": normal,
        "recovery_s": recovery_seconds(windows, normal),
    }


def metrics(out: dict[str, Any]) -> dict[str, float]:
    """The figures the report shows per repeat, from :func:`analyse`'s outcome."""
    overload, recovery = out["overload"], out["recovery"]
    return {
        "capacity_req_s": out["capacity_per_s"],
        "offered_req_s": overload["offered_per_s"],
        "goodput_req_s": overload["goodput_per_s"],
        "goodput_ratio": overload["goodput_per_s"] / out["capacity_per_s"],
        "admitted_p99_ms": overload["admitted_p99_ms"],
        "unanswered_10s": out["unanswered"] + overload["late"] + recovery["late"],
        "503_overload": overload["rejected_503"],
        "503_recovery": recovery["rejected_503"],
        "pre_p99_ms": out["pre"]["p99_ms"],
        "recovery_s": out["recovery_s"],
    }


def open_plan(tgt: Target, rate: float, duration_s: float, **more: Any) -> LoadPlan:
    """An open loop at ``rate`` recording its timeline, at most MAX_CONNECTIONS connections."""
    limits = {"timeout_s": LATE_S, "max_connections": MAX_CONNECTIONS, "timeline": True}
    return LoadPlan(tgt, "open", rate=rate, duration_s=duration_s, **limits, **more)


def _sweep_point(ctx: runner.Ctx, tgt: Target, capacity: float, factor: float) -> dict:
    """An open-loop run at ``factor`` x capacity, warmed up (the window opens on running load)."""
    d, rate = ctx.duration_s, factor * capacity
    res = ctx.gen.run(open_plan(tgt, rate, d, warmup_s=ctx.warmup_s))
    items = answers(res.timeline)
    return {"factor": factor, **phase_stats(items, 0.0, d, rate), "generator_behind": res.behind}


def overload_once(ctx: runner.Ctx, row: RowResult, system: str, rnd: int) -> dict:
    """Capacity (closed loop, c=16), then one open-loop run of :data:`PHASES`, ``duration_s``
    each; in round 1 also one open-loop run per SWEEP_FACTORS (the plot). The phases' detail
    goes to ``row.extra``."""
    props = {"job_queue_size": JOB_QUEUE_SIZE, "max_queue_delay_ms": QUEUE_DELAY_MS}
    where, d = runner.run_dir(ctx, "overload", system, f"r{rnd}"), ctx.duration_s
    with runner.serving(ctx, system, {"cnn": CNN_B8_W2}, where, props=props) as server:
        tgt = runner.target(ctx, server, "cnn", "cnn")
        pids = (server.proc.pid, [p.pid for p in ctx.gen.procs])  # type: ignore[union-attr]
        at_capacity = procstat.Window.within(pids, procstat.closed_run_opens(ctx.warmup_s), d)
        capacity = runner.closed(ctx, tgt, 16).ok_per_s
        steps = tuple((d, f * capacity) for f in PHASES.values())
        phase = procstat.Window(*pids, START_MARGIN_S + d, START_MARGIN_S + 2 * d)  # the 4x
        result = ctx.gen.run(open_plan(tgt, PHASES["overload"] * capacity, 3 * d, steps=steps))
        lost = result.statuses.get(TIMEOUT, 0)
        outcome = analyse(result.timeline, capacity, steps, lost, result.sent)
        good, served = outcome["overload"]["goodput_per_s"] * d, capacity * at_capacity.span_s
        cpu = procstat.figures(at_capacity.seconds(), served, phase.seconds(), d, good)
        if rnd == 1:
            sweep = [_sweep_point(ctx, tgt, capacity, f) for f in SWEEP_FACTORS]
            row.extra["sweep"][system] = sweep
    detail = {**outcome, "generator_behind": result.behind}
    row.extra["detail"].setdefault(system, []).append(detail)
    return {system: {**metrics(outcome), **cpu}}


OVERLOAD_KEYS = ("goodput_ratio", "capacity_req_s", "admitted_p99_ms", "unanswered_10s")
OVERLOAD_KEYS += ("503_overload", "503_recovery", "recovery_s", *procstat.FIGURES)


def row_overload(ctx: runner.Ctx) -> runner.Row:
    row = RowResult(
        "overload",
        "cnn, 4x overload, then recovery at 0.5x",
        f"{CNN_B8_W2.describe()}; job_queue_size {JOB_QUEUE_SIZE}; torchbay max_queue_delay_ms "
        f"{QUEUE_DELAY_MS}; capacity: closed loop c=16; then open loop 0.5x / 4x / 0.5x, "
        f"{ctx.duration_s:g} s each, <= {MAX_CONNECTIONS} connections; goodput: 200s answered "
        "in the 4x phase per second; sweep (repeat 1): open loop at 0.5/1/2/4x capacity",
        extra={"sweep": {}, "detail": {}},
    )
    systems = runner.systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    sweep_s = 4 * (ctx.warmup_s + ctx.duration_s) / ctx.repeat
    estimate = ctx.warmup_s + 4 * ctx.duration_s + 8 + sweep_s
    cells = [runner.Cell((s,), partial(overload_once, ctx, row, s), estimate) for s in systems]
    lost = f"{TORCHBAY}: unanswered 10 s after the scheduled send"
    back = f"{TORCHBAY}: seconds until normal after the overload (n/a: not normal by the end)"
    ts = Goal("TorchServe: goodput / capacity", "", TORCHSERVE, "goodput_ratio", op=">=")
    goals = [
        Goal(f"{TORCHBAY}: goodput / capacity", "", TORCHBAY, "goodput_ratio", 0.90, op=">="),
        Goal(lost, "", TORCHBAY, "unanswered_10s", 0, aggregate="max"),
        Goal(back, "", TORCHBAY, "recovery_s", RECOVERY_BOUND_S),
        *runner.beside_torchserve(systems, ts),
    ]

    def judge(r: RowResult) -> list[Ratio]:
        """The admitted p99's bound is queue delay + 2x the pre-overload p99 measured."""
        bound = QUEUE_DELAY_MS + 2 * median(r.series(TORCHBAY, "pre_p99_ms"))
        name = f"{TORCHBAY}: admitted p99 ms (bound: queue delay + 2x pre-overload p99)"
        return [Ratio(name, r.series(TORCHBAY, "admitted_p99_ms"), bound, "<=")]

    return runner.Row(row, cells, OVERLOAD_KEYS, goals, judge)
