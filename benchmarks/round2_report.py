"""The round-two report: one markdown table per row (system, metric, median, every repeat), its
ratios and targets (aggregate, every repeat, bound, met?), the JSON of every raw number, and the
overload sweep plot is ``plots.sweep_plot``)."""

from __future__ import annotations

import math
from typing import Any

from torchbay.benchmarks.round2_run import Ratio, RowResult

_DIGITS = {"req_s": 0, "capacity_req_s": 0, "offered_req_s": 0, "goodput_req_s": 0}


def fmt(value: float, metric: str = "") -> str:
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "n/a"
    digits = _DIGITS.get(metric, 0 if abs(value) >= 100 else 2)
    return f"{value:,.{digits}f}"


def _median(values: list[float]) -> float:
    return Ratio("", values).summary()


def row_markdown(row: RowResult) -> str:
    lines = [f"### {row.title}", "", f"Settings: {row.settings}", ""]
    lines += ["| system | metric | median | every repeat |", "|---|---|---|---|"]
    for system, per_repeat in row.systems.items():
        metrics = list(per_repeat[0]) if per_repeat else []
        for metric in metrics:
            values = [m.get(metric, math.nan) for m in per_repeat]
            every = ", ".join(fmt(v, metric) for v in values)
            lines.append(f"| {system} | {metric} | {fmt(_median(values), metric)} | {every} |")
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
