"""Every table of RESULTS.md, one command: ``python -m torchbay.benchmarks.tables NAME [flags]``
(``reference``: issue 3's scenarios, ``round2``: issue 15's rows beside TorchServe, ``grpc``:
issue 12's gRPC / HTTP pairs). A table is a list of ``runner.Row`` s that ``runner.run_rows``
measures into ``--out``/``STEM.md``, ``STEM.json`` and a plot when a row has a sweep."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import NamedTuple

from torchbay.benchmarks import cli, managed, plots, report, runner
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator
from torchbay.benchmarks.models import MODEL_NAMES
from torchbay.benchmarks.report import Ratio, RowResult, ratios
from torchbay.benchmarks.round2_rows import ROWS, scenario_cells
from torchbay.benchmarks.runner import Assets, Cell, Ctx, Row
from torchbay.benchmarks.scenarios import TARGETS, Scenario, select

OUT, RESULTS = cli.DEFAULT_OUT, cli.REPO_ROOT / "results" / "round2"


class Table(NamedTuple):
    """Rows and settings line, title, file stem, default folders, (repeat, duration, warm-up)."""

    rows: Callable[[Ctx, argparse.Namespace], tuple[list[Row], str]]
    title: str
    stem: str
    out: Path
    work: Path | None
    windows: tuple[int, float, float]


INPROCESS = "inprocess"
REFERENCE_SETTINGS = (
    "torchbay's load generator, 1 process, keep-alive connections, raw float32 body; warm-up "
    "{c.warmup_s:g} s, {c.duration_s:g} s measured; medians of {c.repeat} round(s); other CPU: "
    "the machine's CPU that neither the server nor the generator used (foreign_cpu_pct, a share "
    "of all cores; above a few percent the run was disturbed and its numbers are low)"
)


def plan(only: Sequence[str]) -> tuple[list[Scenario], bool]:
    """The scenarios ``--only`` selects, and whether the in-process loop runs. No ``--only``:
    everything; otherwise the loop runs when ``inprocess`` or ``ceiling`` is asked for."""
    asked = [p.strip() for item in only for p in item.split(",") if p.strip()]
    patterns = [p for p in asked if p != INPROCESS]
    want_inprocess = not asked or INPROCESS in asked or "ceiling" in asked
    return (select(patterns) if patterns or not asked else []), want_inprocess


def reference_rows(ctx: Ctx, args: argparse.Namespace) -> tuple[list[Row], str]:
    """One system per scenario, TARGETS judged round by round; and the in-process loop's
    samples/s per model and batch size."""
    scenarios, inprocess = plan(args.only)
    row = RowResult("scenarios", "Reference scenarios (issue 3)", "", wide=True)
    row.settings = REFERENCE_SETTINGS.format(c=ctx)
    estimate = ctx.warmup_s + ctx.duration_s + 5
    cells = scenario_cells(scenarios, lambda s, rnd: runner.run_scenario(s, ctx, rnd), estimate)
    names = {s.name for s in scenarios}
    goals = [g for g in TARGETS if {g.numerator, g.denominator} - {None} <= names]
    rows = [Row(row, cells, ("req_per_s",), goals)]
    if inprocess:
        loop = RowResult("inprocess", "Model in process, one thread (samples/s)", "", wide=True)

        def measure(rnd: int) -> dict[str, dict[str, float]]:
            rates = runner.run_inprocess(ctx).items()
            return {m: {f"batch {b}": v for b, v in per.items()} for m, per in rates}

        cell = Cell(MODEL_NAMES, measure, 6 * ctx.inprocess_seconds + 4)
        rows.append(Row(loop, [cell], ("batch 1",)))
    return rows, "; ".join(f"{s.name}: {s.setup}" for s in scenarios)


# The gRPC table: a cell per model, protocol pair and concurrency, both sides on one fresh server
# (grpc_pair.run_grpc_bench). ``tensor`` sends a typed FP32 tensor to the model packed with the
# built-in ``tensor`` handler (Triton's case); the other pairs send the raw body.
PAIRS = {
    "predictions": "HTTP /predictions vs gRPC Predictions",
    "modelinfer": "HTTP v2 binary vs gRPC ModelInfer (BYTES body)",
    "tensor": "HTTP v2 binary vs gRPC ModelInfer (FP32 tensor)",
}
Inputs = dict[str, dict[str, tuple[Path, Path]]]  # model -> pair -> (archive, --input file)


def grpc_cell(model: str, pair: str, concurrency: int) -> str:
    """A system of the gRPC report: ``tiny predictions c=16``."""
    return f"{model} {pair} c={concurrency}"


def grpc_row(ctx: Ctx, inputs: Inputs, concurrencies: list[int]) -> Row:
    """A cell per (model, concurrency, pair) of ``inputs``: each side's ok/s, p50 and p99 and the
    answers not 200, judged by its gRPC / HTTP ok/s."""
    from torchbay.benchmarks.bench import RunOptions
    from torchbay.benchmarks.grpc_pair import run_grpc_bench

    pairs = dict.fromkeys(pair for per in inputs.values() for pair in per)
    row = RowResult("grpc", "gRPC beside HTTP", ", ".join(PAIRS[p] for p in pairs), wide=True)
    windows = {"duration_s": ctx.duration_s, "warmup_s": ctx.warmup_s}

    def run(model: str, pair: str, c: int, rnd: int) -> dict[str, dict[str, float]]:
        archive, source = inputs[model][pair]
        where = runner.run_dir(ctx, model, pair, f"c{c}", f"r{rnd}")
        load = {"inputs": (source,), "concurrency": c, "run_dir": where, **windows}
        options = RunOptions(archive=archive, **load)
        sides = [rep.result for rep in run_grpc_bench(options, pair != "predictions")]
        figures = {}
        for side, r in zip(("http", "grpc"), sides, strict=True):
            figures |= {f"{side}_ok_per_s": r.ok_per_s, f"{side}_p50_ms": r.latency.p50_ms}
            figures[f"{side}_p99_ms"] = r.latency.p99_ms
        figures["not_200"] = float(sum(r.sent - r.ok for r in sides))
        return {grpc_cell(model, pair, c): figures}

    estimate = 2 * (ctx.warmup_s + ctx.duration_s) + 6
    cells = [
        Cell((grpc_cell(m, p, c),), partial(run, m, p, c), estimate)
        for m, per in inputs.items()
        for c in concurrencies
        for p in per
    ]

    def judge(r: RowResult) -> list[Ratio]:
        def ok(n: str, side: str) -> list[float]:
            return r.series(n, f"{side}_ok_per_s")

        return [
            Ratio(f"{n}: gRPC / HTTP ok/s", ratios(ok(n, "grpc"), ok(n, "http"))) for n in r.systems
        ]

    return Row(row, cells, ("http_ok_per_s",), judge=judge)


def tensor_archives(assets: Assets, store: Path) -> dict[str, Path]:
    """Each model packed with the built-in ``tensor`` handler (it speaks v2: typed tensors in
    and out), one sample as a batch of 1 recorded as its example input (its ``--input``), and
    1 intra-op thread as handler_raw.py runs (the budget's 2 on 2 cores ran it 4-5x slower on a
    loaded host, against the raw pairs' 1)."""
    import numpy as np

    from torchbay.benchmarks import models

    store.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, pt in assets.pt.items():
        example = store / f"{name}-example.npy"
        np.save(example, models.sample_tensor(name).numpy()[None])
        config = store / f"{name}-config.yaml"
        config.write_text("cpu_threads: 1\n")
        flags = ("--example-input", str(example), "--config-file", str(config), "--force")
        out[name] = runner.archive(name, pt, store, sys.executable, *flags, handler="tensor")
    return out


def grpc_rows(ctx: Ctx, args: argparse.Namespace) -> tuple[list[Row], str]:
    """The archive and ``--input`` file of each model and pair (``tensor``: its own archive)."""
    store, tensor = ctx.assets.model_store, "tensor" in args.pairs
    assert store is not None
    wanted = Assets({m: ctx.assets.pt[m] for m in args.models}, {})
    typed = tensor_archives(wanted, ctx.out_dir / "model_store_tensor") if tensor else {}
    inputs: Inputs = {}
    for m in args.models:
        raw = (store / f"{m}.mar", ctx.assets.body[m])
        inputs[m] = {p: (typed[m], typed[m]) if p == "tensor" else raw for p in args.pairs}
    settings = f"{ctx.repeat} repeat(s) of {ctx.duration_s:g} s after {ctx.warmup_s:g} s warm-up"
    return [grpc_row(ctx, inputs, args.c)], settings


def round2_rows(ctx: Ctx, args: argparse.Namespace) -> tuple[list[Row], str]:
    ts = str(ctx.torchserve) if ctx.torchserve else "not run"
    settings = (
        f"{ctx.repeat} repeat(s); warm-up {ctx.warmup_s:g} s, {ctx.duration_s:g} s measured per "
        "run (the same windows for every system); torchbay's load generator (1 process, "
        "keep-alive, raw float32 bodies); 1 intra-op thread per worker (handler_raw.py); "
        f"identical .mar and config.properties; TorchServe: {ts}"
    )
    return [ROWS[key](ctx) for key in args.only or ROWS], settings


TABLES = {
    "reference": Table(reference_rows, "Reference scenarios", "latest", OUT, None, (2, 20.0, 5.0)),
    # Round two's reports live beside the other results, outside the package (results/README.md).
    "round2": Table(
        round2_rows, "Round two (issue 15)", "round2", RESULTS, OUT / "round2", (3, 10, 3)
    ),
    "grpc": Table(
        grpc_rows, "gRPC beside HTTP (issue 12)", "grpc", OUT / "grpc", None, (3, 10.0, 2.0)
    ),
}


def _csv(choices: Sequence[str], text: str) -> list:
    """Comma-separated ``choices``; without choices, integers >= 1."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if items and all(x in choices if choices else x.isdigit() and int(x) > 0 for x in items):
        return items if choices else [int(x) for x in items]
    expected = ", ".join(choices) or "integers >= 1"
    raise argparse.ArgumentTypeError(f"expected {expected}, comma-separated: {text!r}")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--repeat", type=int, help="rounds; the report has medians")
    common.add_argument("--duration", type=float, help="measured seconds per run")
    common.add_argument("--warmup", type=float, help="warm-up seconds per run")
    common.add_argument("--out", type=Path, help="report, JSON, plot")
    common.add_argument("--work", type=Path, help="models, archives, server logs")
    parser = argparse.ArgumentParser(prog="python -m torchbay.benchmarks.tables")
    sub = parser.add_subparsers(dest="table", required=True)
    ref = sub.add_parser("reference", parents=[common], help="issue 3's reference scenarios")
    ref.add_argument("--quick", action="store_true", help="1 s warm-up, 3 s runs, 1 round")
    ref.add_argument("--only", action="append", default=[], help="NAME, glob, server or tag")
    r2 = sub.add_parser("round2", parents=[common], help="issue 15's rows beside TorchServe")
    r2.add_argument("--torchserve", help="TorchServe 0.12's venv, bin/ or torchserve script")
    r2.add_argument("--starts", type=int, default=3, help="start-row samples (default 3)")
    r2.add_argument("--only", nargs="+", choices=list(ROWS), help="rows to run (default all)")
    grpc = sub.add_parser("grpc", parents=[common], help="issue 12's gRPC / HTTP pairs")
    grpc.add_argument("--models", type=partial(_csv, MODEL_NAMES), default=list(MODEL_NAMES))
    grpc.add_argument("--pairs", type=partial(_csv, tuple(PAIRS)), default=list(PAIRS))
    grpc.add_argument("-c", "--concurrency", dest="c", type=partial(_csv, ()), default=[16])
    return parser


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags, with the table's defaults (``--quick``: short ones) where none was given."""
    parser = build_parser()
    args = parser.parse_args(argv)
    table = TABLES[args.table]
    defaults = (1, 3.0, 1.0) if getattr(args, "quick", False) else table.windows
    for name, default in zip(("repeat", "duration", "warmup"), defaults, strict=True):
        setattr(args, name, default if getattr(args, name) is None else getattr(args, name))
    args.out = args.out or table.out
    args.work = args.work or table.work or args.out
    if args.table == "reference":
        plan(args.only)  # an --only that matches nothing fails here, before anything is built
    if args.repeat < 1 or getattr(args, "starts", 1) < 1 or args.duration <= 0 or args.warmup < 0:
        parser.error("--repeat, --starts >= 1, --duration > 0 and --warmup >= 0, please")
    return args


def run(argv: Sequence[str] | None = None, log: Callable[..., None] = print) -> int:
    args = parse(argv)
    table, given = TABLES[args.table], getattr(args, "torchserve", None)
    torchserve = managed.find_torchserve(given)
    if given and torchserve is None:
        log(f"no torchserve at {given}: its columns say 'not run'", flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    assets = runner.archive_models(runner.prepare_models(args.work), args.work, sys.executable)
    with LoadGenerator(1) as gen:
        ctx = Ctx(args.work, assets, gen, args.duration, args.warmup, args.repeat, torchserve)
        ctx.log, ctx.starts = log, getattr(args, "starts", ctx.starts)
        if getattr(args, "quick", False):
            ctx.inprocess_seconds = 0.5
        rows, settings = table.rows(ctx, args)
        results = runner.run_rows(ctx, rows)
    head = report.header("tables", argv, settings, title=table.title)
    for row in (r for r in results if r.extra.get("sweep")):
        png, title = args.out / f"{table.stem}_{row.key}.png", f"{head['command']}\n{row.settings}"
        path = plots.sweep_plot(row.extra["sweep"], png, title)
        head["plot"] = str(path.name) if path else None
    return report.write(results, head, args.out, table.stem, log)


def main(argv: Sequence[str] | None = None) -> int:
    """:func:`run`; a BenchError is printed to stderr as ``tables: error: MESSAGE`` and gives 1."""
    try:
        return run(argv)
    except BenchError as exc:
        print(f"tables: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
