"""The rows of issue 15's table (``tables round2``): torchbay, TorchServe 0.12 when given, and
the row's ceiling, side by side in every round (overload: round2_overload.py). Batch 8 beside
batch 1 runs on one server in alternating slices (A B B A ...): the host's drift over a repeat,
on a shared host as large as the 3% the row judges, cancels out of the ratio."""

from __future__ import annotations

import concurrent.futures
import os
import statistics
from collections.abc import Callable
from functools import partial

from torchbay.benchmarks import runner
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, LoadResult
from torchbay.benchmarks.report import Ratio, RowResult, ratios
from torchbay.benchmarks.round2_overload import CNN_B8_W2, row_overload
from torchbay.benchmarks.runner import ECHO, TORCHBAY, TORCHSERVE, Cell, Ctx, Row
from torchbay.benchmarks.scenarios import Batching, Goal, Scenario
from torchbay.server.serving.worker_env import worker_env

INPROCESS, INPROCESS_TUNED = "in-process", "in-process, tuned malloc"
TWO_MODELS = {"cnn_a": "cnn", "cnn_b": "cnn"}  # two names, one reference model (each its own mar)
TWO_MODELS_BATCHING = Batching(8, 10, 1)
TWO_MODEL_KEYS = ("alone_a", "alone_b", "together_a", "together_b")
SWEEP_CONCURRENCY = (2, 4, 8, 16)
CONFIGS = {"cnn_b1": Batching(1, 10, 1), "cnn_b8": Batching(8, 10, 1)}
SLICES = 6  # slices per configuration and repeat
LOAD_KEYS = ("req_s", "p50_ms", "p99_ms", "errors")


def _bound(system: str, bound: float) -> float | None:
    """Targets bind torchbay; TorchServe's figure is shown beside it, not judged."""
    return bound if system == TORCHBAY else None


def scenario_cells(
    runs: list[Scenario], measure: Callable[[Scenario, int], dict[str, float]], estimate: float
) -> list[Cell]:
    """A cell per scenario, its name its system: the reference table's and round two's rows."""
    return [Cell((s.name,), lambda rnd, s=s: {s.name: measure(s, rnd)}, estimate) for s in runs]


def _closed_cells(ctx: Ctx, row: RowResult, runs: list[Scenario]) -> list[Cell]:
    """A fresh server per run, warm-up, a closed loop."""

    def measure(run: Scenario, rnd: int) -> dict[str, float]:
        where = runner.run_dir(ctx, row.key, run.name, f"r{rnd}")
        with runner.serving(ctx, run.server, {run.model: run.batching}, where) as server:
            tgt = runner.target(ctx, server, run.model, run.model)
            result = runner.closed(ctx, tgt, run.concurrency or 1)
        if result.behind:
            behind = "; ".join(result.behind)
            row.notes.append(f"repeat {rnd} {run.name}: generator behind ({behind})")
        return pooled([result])

    return scenario_cells(runs, measure, ctx.warmup_s + ctx.duration_s + 3)


def row_tiny(ctx: Ctx) -> Row:
    batching = Batching(8, 5, 1)
    row = RowResult("tiny-c16", "tiny, c=16, batch 8, 1 worker", f"c=16, {batching.describe()}")
    systems = runner.systems_for(ctx, row, TORCHBAY, TORCHSERVE, ECHO)
    runs = [Scenario(s, s, "tiny", 16, 8, 5, 1) for s in systems]
    vs_ts = Goal("torchbay / TorchServe", "", TORCHBAY, "req_s", None, TORCHSERVE)
    goals = [
        Goal("torchbay / bare ASGI", "", TORCHBAY, "req_s", 0.40, ECHO),
        *runner.beside_torchserve(systems, vs_ts),
    ]
    return Row(row, _closed_cells(ctx, row, runs), LOAD_KEYS, goals)


def row_cnn_c16(ctx: Ctx) -> Row:
    loop = "in-process: 2 threads x 1 intra-op thread, batch 8"
    row = RowResult(
        "cnn-c16", "cnn, c=16, batch 8, 2 workers", f"c=16, {CNN_B8_W2.describe()}; {loop}"
    )
    systems = runner.systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    flags = ("--batches", "8", "--streams", "2", "--seconds", str(ctx.duration_s))

    def limit(env: dict | None, rnd: int) -> dict[str, dict[str, float]]:
        """samples/s of two single-threaded loops of the cnn in one fresh process (``env``: its
        environment; the tuned one has the allocator settings torchbay's workers start with)."""
        name = INPROCESS if env is None else INPROCESS_TUNED
        return {name: {"req_s": runner.run_inprocess(ctx, ("cnn",), *flags, env=env)["cnn"][8]}}

    cells = [
        Cell((INPROCESS,), partial(limit, None), ctx.duration_s + 3),
        Cell((INPROCESS_TUNED,), partial(limit, worker_env(os.environ)), ctx.duration_s + 3),
        *_closed_cells(ctx, row, [Scenario(s, s, "cnn", 16, 8, 10, 2) for s in systems]),
    ]
    goals = [
        Goal(f"{s} / in-process", "", s, "req_s", _bound(s, 0.90), INPROCESS, "min")
        for s in systems
    ]
    tuned = f"torchbay / {INPROCESS_TUNED}"
    goals.append(Goal(tuned, "", TORCHBAY, "req_s", None, INPROCESS_TUNED, "min"))
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


def _paired(key: str, concurrencies: tuple[int, ...], ctx: Ctx) -> Row:
    """batch 8 beside batch 1 (issue 15 item 1: never fewer req/s), a server per system and
    concurrency serving both, measured in alternating slices of ``ctx.duration_s / SLICES``
    (each configuration warmed up once, before any slice); bound 0.97 in every repeat."""
    many = len(concurrencies) > 1
    c0, cn = concurrencies[0], concurrencies[-1]
    title = (
        f"cnn, batch 8 vs batch 1 at c={c0}..{cn}" if many else f"cnn, c={c0}, batch 8 vs batch 1"
    )
    row = RowResult(
        key,
        title,
        f"c={', '.join(map(str, concurrencies))}{', a server per concurrency' if many else ''}, "
        f"delay 10 ms, 1 worker each; one server serves both, alternating slices (b1 b8 b8 b1 "
        f"..., {SLICES} each)",
    )
    systems = runner.systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    tags = {(s, c): f"{s} c={c}" if many else s for s in systems for c in concurrencies}

    def measure(s: str, c: int, rnd: int) -> dict[str, dict[str, float]]:
        where = runner.run_dir(ctx, key, s, f"c{c}", f"r{rnd}")
        with runner.serving(ctx, s, CONFIGS, where, names=dict.fromkeys(CONFIGS, "cnn")) as server:
            plans = {}
            for name in CONFIGS:
                tgt = runner.target(ctx, server, name, "cnn")
                plans[name] = LoadPlan(tgt, "closed", c, duration_s=ctx.duration_s / SLICES)
                runner.warm_and_measure(ctx, plans[name])
            slices: dict[str, list[LoadResult]] = {name: [] for name in CONFIGS}
            for name in order(tuple(CONFIGS), SLICES):  # type: ignore[arg-type]
                slices[name].append(runner.warm_and_measure(ctx, plans[name], warm=False))
        return {f"{tags[s, c]} {name[-2:]}": pooled(runs) for name, runs in slices.items()}

    estimate = 2 * (ctx.warmup_s + ctx.duration_s) + 12
    cells, goals = [], []
    for (s, c), tag in tags.items():
        cells.append(Cell((f"{tag} b8", f"{tag} b1"), partial(measure, s, c), estimate))
        name = f"{tag}: batch 8 / batch 1"
        goals.append(Goal(name, "", f"{tag} b8", "req_s", _bound(s, 0.97), f"{tag} b1", "min"))
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


def _two_models_once(ctx: Ctx, system: str, conc: int, rnd: int) -> dict[str, dict[str, float]]:
    """Each model alone (the other idle), then both at once from two generators."""
    models = dict.fromkeys(TWO_MODELS, TWO_MODELS_BATCHING)
    where = runner.run_dir(ctx, "two-models", system, f"r{rnd}")
    with (
        runner.serving(ctx, system, models, where, names=TWO_MODELS) as server,
        LoadGenerator(1) as second,
    ):
        targets = [runner.target(ctx, server, n, "cnn") for n in TWO_MODELS]
        alone = [runner.closed(ctx, t, conc).ok_per_s for t in targets]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pairs = zip(targets, (ctx.gen, second), strict=True)
            runs = [pool.submit(runner.closed, ctx, t, conc, g) for t, g in pairs]
            together = [f.result().ok_per_s for f in runs]
    return {system: dict(zip(TWO_MODEL_KEYS, alone + together, strict=True))}


def row_two_models(ctx: Ctx, concurrency: int = 8) -> Row:
    row = RowResult(
        "two-models",
        "two models on one host (cnn as cnn_a and cnn_b)",
        f"one server per system with both, {TWO_MODELS_BATCHING.describe()} each; "
        f"c={concurrency} per model; alone: the other model idle; together: both at once",
    )
    systems = runner.systems_for(ctx, row, TORCHBAY, TORCHSERVE)
    estimate = 3 * (ctx.warmup_s + ctx.duration_s) + 5
    cells = [Cell((s,), partial(_two_models_once, ctx, s, concurrency), estimate) for s in systems]

    def judge(r: RowResult) -> list[Ratio]:
        """Each model together over alone, and both: the host's budget holds for two models."""
        out = []
        for s in systems:
            prefix = "" if s == TORCHBAY else f"{s}: "
            together, alone = (
                [r.series(s, f"{w}_{x}") for x in "ab"] for w in ("together", "alone")
            )
            pairs = zip("ab", together, alone, strict=True)
            out += [Ratio(f"{prefix}cnn_{x} together / alone", ratios(t, a)) for x, t, a in pairs]
            both = [[x + y for x, y in zip(*w, strict=True)] for w in (together, alone)]
            out.append(Ratio(f"{prefix}combined together / alone", ratios(*both), _bound(s, 0.90)))
        return out

    return Row(row, cells, TWO_MODEL_KEYS, judge=judge)


ROWS: dict[str, Callable[[Ctx], Row]] = {
    "tiny-c16": row_tiny,
    "cnn-c1": partial(_paired, "cnn-c1", (1,)),
    "batch-sweep": lambda ctx: _paired("batch-sweep", SWEEP_CONCURRENCY, ctx),
    "cnn-c16": row_cnn_c16,
    "overload": row_overload,
    "start": row_start,
    "two-models": row_two_models,
}
