"""Summaries of a scenario run: medians over rounds, the target checks, a plain-text table for
the terminal and a markdown fragment for ``benchmarks/RESULTS.md``; and the table and number
helpers every report of the harness uses (``bench run``, ``bench sla``, the scenarios)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from torchbay.benchmarks.procstat import describe_machine
from torchbay.benchmarks.scenarios import Goal, Scenario, ScenarioResult

# The table's metrics, in its column order, and the digits each is shown with.
DIGITS = {
    "req_per_s": 0,
    "p50_ms": 2,
    "p90_ms": 2,
    "p99_ms": 2,
    "errors": 0,
    "cpu_ms_per_req": 3,
    "frontend_rss_mb": 0,
    "tree_pss_mb": 0,
    "start_s": 2,
    "foreign_cpu_pct": 0,
}
METRICS = tuple(DIGITS)


def medians(results: Iterable[ScenarioResult]) -> dict[str, dict[str, float]]:
    """Per scenario, the median of each metric over its successful runs."""
    runs: dict[str, list[ScenarioResult]] = {}
    for result in results:
        if result.error is None:
            runs.setdefault(result.scenario, []).append(result)
    out: dict[str, dict[str, float]] = {}
    for name, group in runs.items():
        out[name] = {}
        for metric in METRICS:
            values = [float(getattr(r, metric)) for r in group]
            values = [v for v in values if not math.isnan(v)]
            out[name][metric] = statistics.median(values) if values else float("nan")
        out[name]["runs"] = len(group)
    return out


def inprocess_medians(rounds: Sequence[dict[str, dict[int, float]]]) -> dict[str, dict[int, float]]:
    """Median samples/s per model and batch size over the rounds of the in-process loop."""
    out: dict[str, dict[int, float]] = {}
    for name in {n for r in rounds for n in r}:
        batches = sorted({b for r in rounds for b in r.get(name, {})})
        out[name] = {
            b: statistics.median([r[name][b] for r in rounds if b in r.get(name, {})])
            for b in batches
        }
    return out


def num(value: float | None, digits: int = 2) -> str:
    """A number with thousands separators; "-" for None or NaN."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.{digits}f}"


def _row(name: str, scenario: Scenario | None, m: dict[str, float], per_run: str) -> list[str]:
    setup = (
        f"{scenario.load} b={scenario.batch_size} d={scenario.max_batch_delay_ms}"
        f" w={scenario.workers}"
        if scenario and scenario.server == "torchbay"
        else (scenario.load if scenario else "")
    )
    return [
        name,
        setup,
        *(num(m.get(metric), DIGITS[metric]) for metric in METRICS),
        per_run,
    ]


HEADER = [
    "scenario",
    "setup",
    "req/s",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "errors",
    "CPU ms/req",
    "frontend RSS MB",
    "tree PSS MB",
    "start s",
    "other CPU %",
    "req/s per run",
]


def table_rows(scenarios: Sequence[Scenario], results: Sequence[ScenarioResult]) -> list[list[str]]:
    """One row per scenario: medians, then each run's req/s (or FAILED)."""
    med = medians(results)
    rows = []
    for scenario in scenarios:
        runs = [r for r in results if r.scenario == scenario.name]
        per_run = ", ".join(
            "FAILED" if r.error else num(r.req_per_s, 0)
            for r in sorted(runs, key=lambda r: r.round)
        )
        rows.append(_row(scenario.name, scenario, med.get(scenario.name, {}), per_run))
    return rows


def target_rows(targets: Sequence[Goal], med: dict[str, dict[str, float]]) -> list[list[str]]:
    rows = []
    for target in targets:
        value = target.value(med)
        if value is None:
            verdict, shown = "not measured", "-"
        else:
            verdict = "met" if target.met(value) else "MISSED"
            shown = f"{value:.2f}x" if target.denominator else num(value, 2)
        rows.append([target.key, target.about, shown, target.describe_bound(), verdict])
    return rows


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False))
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None
) -> str:
    """A markdown table; ``align`` has one character per column: ``:`` right, ``-`` left."""
    rules = ["---:" if a == ":" else "---" for a in (align or "-" * len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rules) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(
    *,
    command: str,
    machine: dict[str, Any],
    settings_line: str,
    scenarios: Sequence[Scenario],
    results: Sequence[ScenarioResult],
    targets: Sequence[Goal],
    inprocess: dict[str, dict[int, float]] | None,
    when: str,
) -> str:
    """The fragment for RESULTS.md: command, machine, scenario table, targets, in-process loop,
    and the first line of each failure."""
    med = medians(results)
    parts = [
        f"### Scenario run {when}",
        "",
        f"Command: `{command}`  ",
        f"Machine: {describe_machine(machine)}  ",
        f"Load: {settings_line}",
        "",
        markdown_table(HEADER, table_rows(scenarios, results)),
        "",
        '"other CPU %": the machine\'s CPU used by processes that were neither the server nor the '
        "load generator during the measured run, as a share of all cores; above a few percent the "
        "run was disturbed and its numbers are low.",
        "",
        "Targets (ratios of medians within this run):",
        "",
        markdown_table(
            ["target", "what", "measured", "bound", "verdict"], target_rows(targets, med)
        ),
    ]
    if inprocess:
        batches = sorted({b for per in inprocess.values() for b in per})
        rows = [[n, *(num(per.get(b), 0) for b in batches)] for n, per in sorted(inprocess.items())]
        parts += [
            "",
            "Model in process, one thread (samples/s, median over rounds):",
            "",
            markdown_table(["model", *(f"batch {b}" for b in batches)], rows),
        ]
    failures = [r for r in results if r.error]
    if failures:
        parts += ["", "Failed runs:", ""]
        parts += [
            f"- {r.scenario} round {r.round}: {r.error.splitlines()[0]} (log: {r.log})"
            for r in failures
        ]
    return "\n".join(parts) + "\n"


def results_json(results: Sequence[ScenarioResult]) -> list[dict]:
    """Every run as a plain dict (NaN kept as null) for machines."""
    return [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(r).items()}
        for r in results
    ]
