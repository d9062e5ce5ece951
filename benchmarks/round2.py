"""Issue 15's table in one command: every row, side by side with TorchServe 0.12 and the ceilings.

    python -m torchbay.benchmarks.round2 [--repeat 3] [--duration 10] [--warmup 3]
        [--torchserve /work/ts-venv] [--starts 3] [--only ROW ...]
        [--out results/round2]

Rows (``--only`` takes these keys): tiny-c16, cnn-c1, batch-sweep, cnn-c16, overload, start,
two-models (``round2_rows.py`` and ``round2_sweep.py`` say what each measures). Without
``--torchserve`` (or when it is not found) the TorchServe columns say "not run". Writes
``round2.md``, ``round2.json`` (every raw number) and ``round2_overload.png`` to ``--out``;
models, archives and server logs go to ``--work``.
Prints an estimate of the run time first and progress with the time left while running.
Exit status 1 when any run failed (the report says which).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from torchbay.benchmarks import managed, plots, report, runner
from torchbay.benchmarks.errors import BenchError, exit_status
from torchbay.benchmarks.loadgen import LoadGenerator
from torchbay.benchmarks.report import RowResult
from torchbay.benchmarks.round2_rows import ROWS, SWEEP_ESTIMATE
from torchbay.benchmarks.runner import Ctx

HERE = Path(__file__).resolve().parent
# Reports live beside the other results, outside the package (results/README.md).
DEFAULT_OUT = HERE.parent / "results" / "round2"
DEFAULT_WORK = HERE / "out" / "round2"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchbay.benchmarks.round2", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--repeat", type=int, default=3, help="repeats of every row (default 3)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured s per run")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up s per run")
    parser.add_argument("--torchserve", help="TorchServe 0.12's venv, bin/ or torchserve script")
    parser.add_argument("--starts", type=int, default=3, help="start-row samples (default 3)")
    parser.add_argument("--only", nargs="+", choices=list(ROWS), help="rows to run (default all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report, JSON, plot")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="models, archives, logs")
    return parser


def estimate_s(ctx: Ctx, rows: Sequence[str]) -> float:
    """Expected seconds for ``rows`` (each row's per-repeat estimate, plus the one sweep)."""
    total = sum(ROWS[key][1](ctx) * ctx.repeat for key in rows)
    total += sum(SWEEP_ESTIMATE[key](ctx) for key in rows if key in SWEEP_ESTIMATE)
    return total * (1.0 if ctx.torchserve is not None else 0.7)


def run(argv: Sequence[str] | None = None, log=print) -> int:
    args = build_parser().parse_args(argv)
    if args.repeat < 1 or args.starts < 1 or args.duration <= 0 or args.warmup < 0:
        raise BenchError("--repeat, --starts >= 1, --duration > 0 and --warmup >= 0, please")
    torchserve = managed.find_torchserve(args.torchserve)
    if args.torchserve and torchserve is None:
        log(f"round2: no torchserve at {args.torchserve}: its columns say 'not run'", flush=True)
    keys = args.only or list(ROWS)
    args.work.mkdir(parents=True, exist_ok=True)
    assets = runner.prepare_models(args.work)
    assets = runner.archive_models(assets, args.work, sys.executable)
    rows: list[RowResult] = []
    with LoadGenerator(1) as gen:
        ctx = Ctx(args.work, assets, gen, args.duration, args.warmup, args.repeat, torchserve)
        ctx.log, ctx.starts = log, args.starts
        ctx.eta = report.Eta(estimate_s(ctx, keys), lambda line: log(line, flush=True))
        log(
            f"round2: rows {', '.join(keys)}; {ctx.repeat} repeat(s) of {ctx.duration_s:g} s "
            f"after {ctx.warmup_s:g} s warm-up; estimate ~{ctx.eta.total / 60:.1f} min",
            flush=True,
        )
        for key in keys:
            rows.append(ROWS[key][0](ctx))
    ts = str(ctx.torchserve) if ctx.torchserve else "not run"
    settings = (
        f"{ctx.repeat} repeat(s); warm-up {ctx.warmup_s:g} s, {ctx.duration_s:g} s measured per "
        "run (the same windows for every system); torchbay's load generator (1 process, "
        "keep-alive, raw float32 bodies); 1 intra-op thread per worker (handler_raw.py); "
        f"identical .mar and config.properties; TorchServe: {ts}"
    )
    head = report.header("round2", argv, settings, title="Round two (issue 15)")
    overload = next((r for r in rows if r.key == "overload"), None)
    if overload is not None and overload.extra.get("sweep"):
        title = f"{head['command']}\n{overload.settings}"
        path = plots.sweep_plot(overload.extra["sweep"], args.out / "round2_overload.png", title)
        head["plot"] = str(path.name) if path else None
    return report.write(rows, head, args.out, "round2", log)


def main(argv: Sequence[str] | None = None) -> int:
    return exit_status("round2", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
