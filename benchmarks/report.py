"""The harness's one result type, :class:`RowResult` (a table's row, its :class:`Ratio` s judged
against their targets), its report (:func:`write`) and the number formats of every report."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchbay.benchmarks.stats import percentile

AGGREGATES = {"min": 0.0, "median": 50.0, "max": 100.0}  # a Ratio's aggregates, as percentiles


@dataclass(frozen=True)
class Ratio:
    """A figure per repeat and, when ``bound`` is set, its target: ``aggregate`` (median, min or
    max over the repeats) ``op`` ``bound``."""

    name: str
    values: list[float]
    bound: float | None = None
    op: str = ">="
    aggregate: str = "median"

    def summary(self) -> float:
        """The aggregate; NaN when there is no repeat or one failed (is not finite)."""
        if not all(math.isfinite(v) for v in self.values):
            return math.nan
        return percentile(self.values, AGGREGATES[self.aggregate])

    def met(self) -> bool | None:
        """None without a target; never met when a repeat failed (NaN compares False)."""
        if self.bound is None:
            return None
        value = self.summary()
        return value >= self.bound if self.op == ">=" else value <= self.bound

    def cells(self) -> list[str]:
        """Its line of a report: name, summary, every repeat, target, met?"""
        target = "" if self.bound is None else f"{self.aggregate} {self.op} {self.bound:g}"
        met = {None: "", True: "met", False: "MISSED"}[self.met()]
        return [self.name, fmt(self.summary()), _every(self.values), target, met]


@dataclass
class RowResult:
    """One row of a report: per system (a server, a scenario, a loop), one dict of metrics per
    repeat (NaN where it failed, the error in ``errors``). ``wide``: a column per metric."""

    key: str
    title: str
    settings: str
    systems: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    ratios: list[Ratio] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. the load generator fell behind
    extra: dict[str, Any] = field(default_factory=dict)
    wide: bool = False

    def add(self, system: str, metrics: dict[str, float]) -> None:
        self.systems.setdefault(system, []).append(metrics)

    def series(self, system: str, metric: str) -> list[float]:
        return [m.get(metric, math.nan) for m in self.systems.get(system, [])]


class Eta:
    """Progress on the log: units done / total, elapsed, and the time left at the pace so far. A
    unit is a step of the SLA search, or an estimated second of a table's cells."""

    def __init__(
        self, total: float, log: Callable[[str], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total, self.done, self.log, self.clock = total, 0.0, log, clock
        self.started = clock()

    def drop(self, units: float) -> None:
        """``units`` planned that will not run (fewer configurations to repeat than planned)."""
        self.total = max(self.done, self.total - max(0, units))

    def tick(self, what: str, units: float = 1.0) -> None:
        self.done = min(self.done + units, self.total)
        elapsed = self.clock() - self.started
        left = elapsed / self.done * (self.total - self.done) if self.done else math.nan
        self.log(
            f"progress: {self.done:.0f}/{self.total:.0f} {what}; elapsed {elapsed:.0f} s, "
            f"about {left:.0f} s left"
        )


def ratios(top: list[float], bottom: list[float]) -> list[float]:
    """``top / bottom`` repeat by repeat; NaN where either is not finite or ``bottom`` <= 0."""
    pairs = zip(top, bottom, strict=False)
    return [t / b if math.isfinite(t + b) and b > 0 else math.nan for t, b in pairs]


def failed(row: RowResult, system: str, rep: int, exc: Exception, keys: tuple[str, ...]) -> None:
    """Record ``system`` 's failure in repeat ``rep``: its error, and NaN for ``keys``."""
    row.errors.append(f"repeat {rep} {system}: {str(exc).splitlines()[0]}")
    row.add(system, dict.fromkeys(keys, math.nan))


def median(values: list[float]) -> float:
    """The median of ``values``; NaN if any is not finite."""
    return Ratio("", values).summary()


def fmt(value: float, metric: str = "") -> str:
    """Whole numbers for rates (``*req_s``) and from 100 up, else 2 digits; n/a if not a number."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "n/a"
    return num(value, 0 if metric.endswith("req_s") or abs(value) >= 100 else 2)


def _every(values: list[float], metric: str = "") -> str:
    return ", ".join(fmt(v, metric) for v in values)


def _system_lines(row: RowResult) -> list[str]:
    """Wide: a line per system, the median of each metric over the repeats that did not fail,
    then every repeat of the first metric. Long: a line per system and metric, the median (n/a
    if a repeat failed) and every repeat, then the systems not run."""
    cells = []
    if row.wide:
        metrics = list(dict.fromkeys(k for runs in row.systems.values() for m in runs for k in m))
        for s in row.systems:
            finite = {k: [v for v in row.series(s, k) if math.isfinite(v)] for k in metrics}
            medians = [fmt(median(finite[k]), k) for k in metrics]
            cells.append([s, *medians, _every(row.series(s, metrics[0]), metrics[0])])
        header = ["system", *metrics, f"{metrics[0] if metrics else ''} every repeat"]
        return markdown_table(header, cells).splitlines()
    for s, runs in row.systems.items():
        for k in runs[0] if runs else ():
            cells.append([s, k, fmt(median(row.series(s, k)), k), _every(row.series(s, k), k)])
    lines = markdown_table(["system", "metric", "median", "every repeat"], cells).splitlines()
    return lines + [f"| {system} | | {why} | |" for system, why in row.not_run.items()]


def row_markdown(row: RowResult) -> str:
    lines = [f"### {row.title}", "", f"Settings: {row.settings}", "", *_system_lines(row)]
    if row.ratios:
        header = ["ratio / figure", "value", "every repeat", "target", "met?"]
        lines += ["", markdown_table(header, [r.cells() for r in row.ratios])]
    for label, items in (("Failures", row.errors), ("Notes", row.notes)):
        if items:
            lines += ["", f"{label}: " + "; ".join(items)]
    return "\n".join(lines) + "\n"


def render(rows: list[RowResult], header: dict[str, Any]) -> str:
    """The whole report: command, machine and settings first, then every row."""
    out = [f"## {header.get('title', 'Benchmark run')}", ""]
    out += [f"Command: `{header['command']}`  ", f"When: {header['when']}  "]
    out += [f"Machine: {header['machine']}  ", f"Settings: {header['settings']}", ""]
    out += [row_markdown(row) for row in rows]
    if header.get("plot"):
        out.append(f"Plot: `{header['plot']}` (goodput and p99 against offered load)\n")
    return "\n".join(out)


def header(prog: str, argv: Sequence[str] | None, settings: str, **extra: Any) -> dict[str, Any]:
    """A report's head: the command as run, when, the machine and the run's settings."""
    from torchbay.benchmarks.procstat import machine_info

    args = shlex.join(sys.argv[1:] if argv is None else list(argv))
    return {
        "command": f"python -m torchbay.benchmarks.{prog} {args}".strip(),
        "when": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "machine": json.dumps(machine_info()),
        "settings": settings,
        **extra,
    }


def write(rows: list[RowResult], head: dict[str, Any], out: Path, stem: str, log: Any) -> int:
    """``out/STEM.md`` (also to ``log``) and ``out/STEM.json``; 1 when any row has a failure."""
    out.mkdir(parents=True, exist_ok=True)
    markdown = render(rows, head)
    (out / f"{stem}.md").write_text(markdown, encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps(as_json(rows, head), indent=2, default=str))
    log(markdown, flush=True)
    log(f"wrote {out / stem}.md and {stem}.json", flush=True)
    return 1 if any(r.errors for r in rows) else 0


def as_json(rows: list[RowResult], header: dict[str, Any]) -> dict[str, Any]:
    """The report as JSON: the header, and per row every figure of every repeat."""
    keys = ("title", "settings", "systems", "not_run", "errors", "notes", "extra")
    out = {row.key: {k: getattr(row, k) for k in keys} for row in rows}
    for row in rows:
        out[row.key]["ratios"] = [
            {**dataclasses.asdict(r), "summary": r.summary(), "met": r.met()} for r in row.ratios
        ]
    return {**header, "rows": out}


def num(value: float | None, digits: int = 2) -> str:
    """A number with thousands separators; "-" for None or NaN."""
    return "-" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None
) -> str:
    """A markdown table; ``align`` has one character per column: ``:`` right, ``-`` left."""
    rules = ["---:" if a == ":" else "---" for a in (align or "-" * len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rules) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
