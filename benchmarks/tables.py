"""Round two's table of RESULTS.md, one command: ``python -m torchbay.benchmarks.tables round2
[flags]`` (issue 15's rows beside TorchServe 0.12, round2_rows.py): a list of ``runner.Row`` s
that ``runner.run_rows`` measures into ``--out``/``round2.md``, ``round2.json`` and a plot of the
overload sweep. The reference table (issue 3) and the gRPC table (issue 12) ran up to commit
1adc89d (``git checkout 1adc89d`` runs them; RESULTS.md names it in their sections)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from torchbay.benchmarks import cli, managed, plots, report, runner
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator
from torchbay.benchmarks.round2_rows import ROWS
from torchbay.benchmarks.runner import Ctx, Row

# Round two's reports live beside the other results, outside the package (results/README.md).
OUT, WORK = cli.REPO_ROOT / "results" / "round2", cli.REPO_ROOT / "benchmarks" / "out" / "round2"
TITLE, STEM = "Round two (issue 15)", "round2"
WINDOWS = (3, 10.0, 3.0)  # the defaults of --repeat, --duration, --warmup


def round2_rows(ctx: Ctx, args: argparse.Namespace) -> tuple[list[Row], str]:
    ts = str(ctx.torchserve) if ctx.torchserve else "not run"
    settings = (
        f"{ctx.repeat} repeat(s); warm-up {ctx.warmup_s:g} s, {ctx.duration_s:g} s measured per "
        "run (the same windows for every system); torchbay's load generator (1 process, "
        "keep-alive, raw float32 bodies); 1 intra-op thread per worker (handler_raw.py); "
        f"identical .mar and config.properties; TorchServe: {ts}"
    )
    return [ROWS[key](ctx) for key in args.only or ROWS], settings


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--repeat", type=int, help="rounds; the report has medians")
    common.add_argument("--duration", type=float, help="measured seconds per run")
    common.add_argument("--warmup", type=float, help="warm-up seconds per run")
    common.add_argument("--out", type=Path, help="report, JSON, plot")
    common.add_argument("--work", type=Path, help="models, archives, server logs")
    parser = argparse.ArgumentParser(prog="python -m torchbay.benchmarks.tables")
    sub = parser.add_subparsers(dest="table", required=True)
    r2 = sub.add_parser("round2", parents=[common], help="issue 15's rows beside TorchServe")
    r2.add_argument("--torchserve", help="TorchServe 0.12's venv, bin/ or torchserve script")
    r2.add_argument("--starts", type=int, default=3, help="start-row samples (default 3)")
    r2.add_argument("--only", nargs="+", choices=list(ROWS), help="rows to run (default all)")
    return parser


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags, with the table's defaults where none was given."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, default in zip(("repeat", "duration", "warmup"), WINDOWS, strict=True):
        setattr(args, name, default if getattr(args, name) is None else getattr(args, name))
    args.out, args.work = args.out or OUT, args.work or WORK
    if args.repeat < 1 or args.starts < 1 or args.duration <= 0 or args.warmup < 0:
        parser.error("--repeat, --starts >= 1, --duration > 0 and --warmup >= 0, please")
    return args


def run(argv: Sequence[str] | None = None, log: Callable[..., None] = print) -> int:
    args = parse(argv)
    torchserve = managed.find_torchserve(args.torchserve)
    if args.torchserve and torchserve is None:
        log(f"no torchserve at {args.torchserve}: its columns say 'not run'", flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    assets = runner.archive_models(runner.prepare_models(args.work), args.work, sys.executable)
    with LoadGenerator(1) as gen:
        ctx = Ctx(args.work, assets, gen, args.duration, args.warmup, args.repeat, torchserve)
        ctx.log, ctx.starts = log, args.starts
        rows, settings = round2_rows(ctx, args)
        results = runner.run_rows(ctx, rows)
    head = report.header("tables", argv, settings, title=TITLE)
    for row in (r for r in results if r.extra.get("sweep")):
        png, title = args.out / f"{STEM}_{row.key}.png", f"{head['command']}\n{row.settings}"
        path = plots.sweep_plot(row.extra["sweep"], png, title)
        head["plot"] = str(path.name) if path else None
    return report.write(results, head, args.out, STEM, log)


def main(argv: Sequence[str] | None = None) -> int:
    """:func:`run`; a BenchError is printed to stderr as ``tables: error: MESSAGE`` and gives 1."""
    try:
        return run(argv)
    except BenchError as exc:
        print(f"tables: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
