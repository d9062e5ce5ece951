"""Run the issue-3 benchmark scenarios and write ``out/latest.md`` (+ ``latest.json``).

    python -m torchbay.benchmarks.run_scenarios [--quick] [--only NAME[,NAME]] [--repeat N]

``--only`` takes scenario names (globs allowed), a server kind (``echo``, ``naive``, ``torchbay``)
or a tag (``ceiling``, ``a``..``d``); ``inprocess`` selects the in-process model loop. Every round
runs each selected scenario once, so drift over time spreads across scenarios; the report shows
medians over rounds. Exit status 1 if any run failed (its log path is in the report).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from torchbay.benchmarks import report, runner
from torchbay.benchmarks.errors import exit_status
from torchbay.benchmarks.loadgen import LoadGenerator
from torchbay.benchmarks.procstat import machine_info
from torchbay.benchmarks.scenarios import TARGETS, Scenario, select

DEFAULT_OUT = Path(__file__).resolve().parent / "out"
INPROCESS = "inprocess"


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


def _status(result: runner.ScenarioResult) -> str:
    if result.error:
        return f"FAILED: {result.error.splitlines()[0]}"
    return f"{result.req_per_s:,.0f} req/s, p99 {result.p99_ms:.2f} ms"


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    scenarios, want_inprocess = plan(args.only)
    args.out.mkdir(parents=True, exist_ok=True)

    assets = runner.prepare_models(args.out)
    if any(s.server == "torchbay" for s in scenarios):
        assets = runner.archive_models(assets, args.out, sys.executable)
        print(f"archived with torchbay archive into {assets.model_store}", flush=True)

    results: list[runner.ScenarioResult] = []
    inprocess_rounds: list[dict[str, dict[int, float]]] = []
    with LoadGenerator(1) as gen:
        settings = runner.Ctx(args.out, assets, gen, **settings_from_args(args))
        for round_no in range(1, settings.repeat + 1):
            if want_inprocess:
                inprocess_rounds.append(runner.run_inprocess(settings))
                print(f"[round {round_no}] in-process loop: {inprocess_rounds[-1]}", flush=True)
            for scenario in scenarios:
                result = runner.run_scenario(scenario, settings, round_no)
                results.append(result)
                print(f"[round {round_no}] {scenario.name}: {_status(result)}", flush=True)

    command = "python -m torchbay.benchmarks.run_scenarios " + shlex.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    settings_line = (
        "torchbay's load generator, 1 process, closed loop with C keep-alive connections, raw "
        f"float32 body; warm-up {settings.warmup_s:g} s, "
        f"{settings.duration_s:g} s measured; medians of {settings.repeat} round(s)."
    )
    print()
    print(report.text_table(report.HEADER, report.table_rows(scenarios, results)))
    print()
    med = report.medians(results)
    print(
        report.text_table(
            ["target", "what", "measured", "bound", "verdict"], report.target_rows(TARGETS, med)
        )
    )
    inprocess = report.inprocess_medians(inprocess_rounds) if inprocess_rounds else None
    markdown = report.render_markdown(
        command=command.strip(),
        machine=machine_info(),
        settings_line=settings_line,
        scenarios=scenarios,
        results=results,
        targets=TARGETS,
        inprocess=inprocess,
        when=dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    )
    (settings.out_dir / "latest.md").write_text(markdown, encoding="utf-8")
    (settings.out_dir / "latest.json").write_text(
        json.dumps({"runs": report.results_json(results), "inprocess": inprocess}, indent=2)
    )
    print(f"\nwrote {settings.out_dir / 'latest.md'}")
    return 1 if any(r.error for r in results) else 0


def main(argv: Sequence[str] | None = None) -> int:
    return exit_status("run_scenarios", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
