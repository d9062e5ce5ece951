"""What round two's rows share beyond the runner (``runner.py`` starts the systems and
measures): a row's result (:class:`RowResult`) and its judged figures (:class:`Ratio`), the
in-process limit of the cnn, how a system that was not given or that failed is recorded, and the
report: one markdown table per row (system, metric, median, every repeat), its ratios and targets
(aggregate, every repeat, bound, met?), and the JSON of every raw number.

TorchServe gets the identical ``.mar`` (``torchbay archive`` with ``handler_raw.py``) and the same
config.properties values except torchbay-only keys (``runner.TORCHBAY_ONLY_KEYS``): TorchServe
0.12 has no such setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torchbay.benchmarks.loadgen import LoadResult
from torchbay.benchmarks.runner import TORCHSERVE, Ctx, run_inprocess

INPROCESS = "in-process"
NOT_RUN = "not run"


def load_metrics(result: LoadResult) -> dict[str, float]:
    """req/s, p50/p99 and the error count of one closed-loop run."""
    return {
        "req_s": result.ok_per_s,
        "p50_ms": result.latency.p50_ms,
        "p99_ms": result.latency.p99_ms,
        "errors": float(result.errors),
    }


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
        if self.aggregate == "max":
            return finite[-1]
        mid = len(finite) // 2
        return finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2

    def met(self) -> bool | None:
        if self.bound is None:
            return None
        value = self.summary()
        if not math.isfinite(value):
            return False
        return value >= self.bound if self.op == ">=" else value <= self.bound


@dataclass
class RowResult:
    key: str
    title: str
    settings: str
    systems: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    ratios: list[Ratio] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. the load generator fell behind
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, system: str, metrics: dict[str, float]) -> None:
        self.systems.setdefault(system, []).append(metrics)

    def series(self, system: str, metric: str) -> list[float]:
        return [m.get(metric, math.nan) for m in self.systems.get(system, [])]


def ratio(top: float, bottom: float) -> float:
    if not (math.isfinite(top) and math.isfinite(bottom)) or bottom <= 0:
        return math.nan
    return top / bottom


def ratios(top: list[float], bottom: list[float]) -> list[float]:
    """:func:`ratio` of two series, repeat by repeat."""
    return [ratio(t, b) for t, b in zip(top, bottom, strict=False)]


def inprocess_limit(ctx: Ctx, batch: int, streams: int, env: dict | None = None) -> float:
    """samples/s of ``streams`` single-threaded loops of the cnn in one fresh process (``env``:
    its environment, None: ours), for ``duration_s``."""
    flags = ("--batches", str(batch), "--streams", str(streams), "--seconds", str(ctx.duration_s))
    return run_inprocess(ctx, ("cnn",), *flags, env=env)["cnn"][batch]


def systems_for(ctx: Ctx, row: RowResult, *names: str) -> list[str]:
    """``names`` less TorchServe when it was not given (marked "not run")."""
    if ctx.torchserve is None and TORCHSERVE in names:
        row.not_run[TORCHSERVE] = f"{NOT_RUN} (no --torchserve)"
    return [n for n in names if n != TORCHSERVE or ctx.torchserve is not None]


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


def row_markdown(row: RowResult) -> str:
    lines = [f"### {row.title}", "", f"Settings: {row.settings}", ""]
    lines += ["| system | metric | median | every repeat |", "|---|---|---|---|"]
    for system, per_repeat in row.systems.items():
        metrics = list(per_repeat[0]) if per_repeat else []
        for metric in metrics:
            values = [m.get(metric, math.nan) for m in per_repeat]
            every = ", ".join(fmt(v, metric) for v in values)
            lines.append(f"| {system} | {metric} | {fmt(median(values), metric)} | {every} |")
    for system, why in row.not_run.items():
        lines.append(f"| {system} | | {why} | |")
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
    out = ["## Round two (issue 15)", ""]
    out += [f"Command: `{header['command']}`  ", f"When: {header['when']}  "]
    out += [f"Machine: {header['machine']}  ", f"Settings: {header['settings']}", ""]
    for row in rows:
        out.append(row_markdown(row))
    if header.get("plot"):
        out.append(f"Plot: `{header['plot']}` (goodput and p99 against offered load)\n")
    return "\n".join(out)


def as_json(rows: list[RowResult], header: dict[str, Any]) -> dict[str, Any]:
    return {
        **header,
        "rows": {
            row.key: {
                "title": row.title,
                "settings": row.settings,
                "systems": row.systems,
                "not_run": row.not_run,
                "ratios": [
                    {
                        "name": r.name,
                        "values": r.values,
                        "summary": r.summary(),
                        "bound": r.bound,
                        "op": r.op,
                        "aggregate": r.aggregate,
                        "met": r.met(),
                    }
                    for r in row.ratios
                ],
                "errors": row.errors,
                "notes": row.notes,
                "extra": row.extra,
            }
            for row in rows
        },
    }
