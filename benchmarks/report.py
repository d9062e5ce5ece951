"""The harness's one result type, :class:`RowResult` (a table's row: per system, each repeat's
metrics, and :class:`Ratio` s judged against their targets), and its report (:func:`render`,
:func:`as_json`, :func:`write`); beside them the table and number helpers of every report.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
        finite = sorted(v for v in self.values if math.isfinite(v))
        if len(finite) != len(self.values) or not finite:
            return math.nan
        if self.aggregate == "min":
            return finite[0]
        return finite[-1] if self.aggregate == "max" else statistics.median(finite)

    def met(self) -> bool | None:
        if self.bound is None:
            return None
        value = self.summary()
        if not math.isfinite(value):
            return False
        return value >= self.bound if self.op == ">=" else value <= self.bound


@dataclass
class RowResult:
    """One row of a report: per system (a server, a scenario, a loop), one dict of metrics per
    repeat; a system that failed a repeat has NaN there and its error in ``errors``. ``wide``
    rows show one line per system with a column per metric (many metrics, few repeats)."""

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
    """Progress of a long run on its log: units done / total, elapsed, and the time left (elapsed
    per unit so far times the units left). A unit is a step of the SLA search, or an estimated
    second of a table's cells (so a cell that takes longer than estimated weighs more)."""

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


def ratio(top: float, bottom: float) -> float:
    if not (math.isfinite(top) and math.isfinite(bottom)) or bottom <= 0:
        return math.nan
    return top / bottom


def ratios(top: list[float], bottom: list[float]) -> list[float]:
    """:func:`ratio` of two series, repeat by repeat."""
    return [ratio(t, b) for t, b in zip(top, bottom, strict=False)]


def failed(row: RowResult, system: str, rep: int, exc: Exception, keys: tuple[str, ...]) -> None:
    """Record ``system`` 's failure in repeat ``rep``: its error, and NaN for ``keys``."""
    row.errors.append(f"repeat {rep} {system}: {str(exc).splitlines()[0]}")
    row.add(system, dict.fromkeys(keys, math.nan))


def median(values: list[float]) -> float:
    """The median of ``values``; NaN if any is not finite."""
    return Ratio("", values).summary()


_DIGITS = {"req_s": 0, "capacity_req_s": 0, "offered_req_s": 0, "goodput_req_s": 0}


def fmt(value: float, metric: str = "") -> str:
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "n/a"
    digits = _DIGITS.get(metric, 0 if abs(value) >= 100 else 2)
    return f"{value:,.{digits}f}"


def _long_lines(row: RowResult) -> list[str]:
    """One line per system and metric: the median and every repeat."""
    lines = ["| system | metric | median | every repeat |", "|---|---|---|---|"]
    for system, per_repeat in row.systems.items():
        for metric in per_repeat[0] if per_repeat else ():
            values = row.series(system, metric)
            every = ", ".join(fmt(v, metric) for v in values)
            lines.append(f"| {system} | {metric} | {fmt(median(values), metric)} | {every} |")
    return lines + [f"| {system} | | {why} | |" for system, why in row.not_run.items()]


def _wide_lines(row: RowResult) -> list[str]:
    """One line per system: the median of each metric (over the repeats that did not fail),
    then every repeat of the first metric."""
    metrics = list(dict.fromkeys(k for runs in row.systems.values() for m in runs for k in m))
    table = []
    for system in row.systems:
        values = {k: [v for v in row.series(system, k) if math.isfinite(v)] for k in metrics}
        medians = [fmt(median(values[k]) if values[k] else math.nan, k) for k in metrics]
        first = ", ".join(fmt(v, metrics[0]) for v in row.series(system, metrics[0]))
        table.append([system, *medians, first])
    header = ["system", *metrics, f"{metrics[0] if metrics else ''} every repeat"]
    return markdown_table(header, table).splitlines()


def row_markdown(row: RowResult) -> str:
    lines = [f"### {row.title}", "", f"Settings: {row.settings}", ""]
    lines += _wide_lines(row) if row.wide else _long_lines(row)
    if row.ratios:
        lines += [
            "",
            "| ratio / figure | value | every repeat | target | met? |",
            "|---|---|---|---|---|",
        ]
        for r in row.ratios:
            every = ", ".join(fmt(v) for v in r.values)
            target = "" if r.bound is None else f"{r.aggregate} {r.op} {r.bound:g}"
            met = {None: "", True: "met", False: "MISSED"}[r.met()]
            lines.append(f"| {r.name} | {fmt(r.summary())} | {every} | {target} | {met} |")
    if row.errors:
        lines += ["", "Failures: " + "; ".join(row.errors)]
    if row.notes:
        lines += ["", "Notes: " + "; ".join(row.notes)]
    return "\n".join(lines) + "\n"


def render(rows: list[RowResult], header: dict[str, Any]) -> str:
    """The whole report: command, machine and settings first, then every row."""
    out = [f"## {header.get('title', 'Benchmark run')}", ""]
    out += [f"Command: `{header['command']}`  ", f"When: {header['when']}  "]
    out += [f"Machine: {header['machine']}  ", f"Settings: {header['settings']}", ""]
    for row in rows:
        out.append(row_markdown(row))
    if header.get("plot"):
        out.append(f"Plot: `{header['plot']}` (goodput and p99 against offered load)\n")
    return "\n".join(out)


def header(prog: str, argv: Sequence[str] | None, settings: str, **extra: Any) -> dict[str, Any]:
    """A report's head: the command as run (``python -m torchbay.benchmarks.PROG ...``), when, the
    machine and the run's settings."""
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
    """``out/STEM.md`` (:func:`render`) and ``out/STEM.json`` (:func:`as_json`); the markdown
    goes to ``log`` too. Exit status 1 when any row recorded a failure."""
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
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.{digits}f}"


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None
) -> str:
    """A markdown table; ``align`` has one character per column: ``:`` right, ``-`` left."""
    rules = ["---:" if a == ":" else "---" for a in (align or "-" * len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rules) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
