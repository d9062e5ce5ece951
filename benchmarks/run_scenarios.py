"""Run the issue-3 benchmark scenarios and write ``out/latest.md`` (+ ``latest.json``).

    python -m torchbay.benchmarks.run_scenarios [--quick] [--only NAME[,NAME]] [--repeat N]

``--only`` takes scenario names (globs allowed), a server kind (``echo``, ``naive``, ``torchbay``)
or a tag (``ceiling``, ``a``..``d``); ``inprocess`` selects the in-process model loop. Every round
runs each selected scenario once, so drift over time spreads across scenarios; the report shows
medians over rounds. Exit status 1 if any run failed (its log path is in the report).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

from torchbay.benchmarks import report, runner
from torchbay.benchmarks.errors import BenchError, exit_status
from torchbay.benchmarks.loadgen import LoadGenerator
from torchbay.benchmarks.report import RowResult, failed
from torchbay.benchmarks.scenarios import TARGETS, Scenario, select

DEFAULT_OUT = Path(__file__).resolve().parent / "out"
INPROCESS = "inprocess"
SETTINGS = (
    "torchbay's load generator, 1 process, keep-alive connections, raw float32 body; warm-up "
    "{c.warmup_s:g} s, {c.duration_s:g} s measured; medians of {c.repeat} round(s); other CPU: "
    "the machine's CPU that neither the server nor the generator used (foreign_cpu_pct, a share "
    "of all cores; above a few percent the run was disturbed and its numbers are low)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchbay.benchmarks.run_scenarios",
        description="Run torchbay's reference scenarios beside the ceilings; write a report.",
    )
    parser.add_argument("--quick", action="store_true", help="1 s warm-up, 3 s runs, 1 round")
    parser.add_argument("--only", action="append", default=[], help="NAME, glob, server or tag")
    parser.add_argument("--repeat", type=int, help="rounds (default 2; --quick: 1)")
    parser.add_argument("--duration", type=float, help="measured seconds per run (default 20)")
    parser.add_argument("--warmup", type=float, help="warm-up seconds per run (default 5)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    return parser


def settings_from_args(args: argparse.Namespace) -> dict[str, float]:
    """The run's :class:`runner.Ctx` settings: the flags, else their defaults (``--quick``:
    short ones)."""
    quick = args.quick
    return {
        "warmup_s": args.warmup if args.warmup is not None else (1.0 if quick else 5.0),
        "duration_s": args.duration if args.duration is not None else (3.0 if quick else 20.0),
        "repeat": args.repeat if args.repeat is not None else (1 if quick else 2),
        "inprocess_seconds": 0.5 if quick else 2.0,
        "start_timeout_s": 60.0,
    }


def plan(only: Sequence[str]) -> tuple[list[Scenario], bool]:
    """The scenarios ``--only`` selects, and whether the in-process loop runs. No ``--only``:
    everything; otherwise the loop runs when ``inprocess`` or ``ceiling`` is asked for."""
    asked = [p.strip() for item in only for p in item.split(",") if p.strip()]
    patterns = [p for p in asked if p != INPROCESS]
    want_inprocess = not asked or INPROCESS in asked or "ceiling" in asked
    return (select(patterns) if patterns or not asked else []), want_inprocess


def reference_rows(ctx: runner.Ctx, scenarios: list[Scenario], inprocess: bool) -> list[RowResult]:
    """Every round runs the in-process loop (when asked for) and each scenario once: one system
    per scenario, with TARGETS judged round by round; and the loop's samples/s per model."""
    row = RowResult("scenarios", "Reference scenarios (issue 3)", SETTINGS.format(c=ctx), wide=True)
    loop = RowResult("inprocess", "Model in process, one thread (samples/s)", "", wide=True)
    for round_no in range(1, ctx.repeat + 1):
        if inprocess:
            for model, rates in runner.run_inprocess(ctx).items():
                loop.add(model, {f"batch {b}": v for b, v in rates.items()})
            ctx.log(f"[round {round_no}] in-process loop done", flush=True)
        for scenario in scenarios:
            try:
                row.add(scenario.name, runner.run_scenario(scenario, ctx, round_no))
                status = f"{row.series(scenario.name, 'req_per_s')[-1]:,.0f} req/s"
            except (BenchError, psutil.Error) as exc:
                failed(row, scenario.name, round_no, exc, ("req_per_s",))
                status = f"FAILED: {row.errors[-1]} (log: {ctx.out_dir / 'runs'})"
            ctx.log(f"[round {round_no}] {scenario.name}: {status}", flush=True)
    chosen = {s.name for s in scenarios}
    row.ratios = [g.ratio(row) for g in TARGETS if {g.numerator, g.denominator} - {None} <= chosen]
    return [row, loop] if inprocess else [row]


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    scenarios, want_inprocess = plan(args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    assets = runner.prepare_models(args.out)
    if any(s.server == "torchbay" for s in scenarios):
        assets = runner.archive_models(assets, args.out, sys.executable)
        print(f"archived with torchbay archive into {assets.model_store}", flush=True)
    with LoadGenerator(1) as gen:
        ctx = runner.Ctx(args.out, assets, gen, **settings_from_args(args))
        rows = reference_rows(ctx, scenarios, want_inprocess)
    settings = "; ".join(f"{s.name}: {s.setup}" for s in scenarios)
    head = report.header("run_scenarios", argv, settings, title="Reference scenarios")
    return report.write(rows, head, args.out, "latest", print)


def main(argv: Sequence[str] | None = None) -> int:
    return exit_status("run_scenarios", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
