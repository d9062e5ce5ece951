"""The files of an SLA search: ``report.md``, ``results.csv`` (one row per measured step, so every
point of the plots can be checked), ``result.json`` and the plots.

Every table is data: a list of (header, alignment, cell function) columns applied to the rows
(:func:`_table`), written by ``report.markdown_table``.
"""

from __future__ import annotations

import csv
import json
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchbay.benchmarks.procstat import describe_machine, machine_info
from torchbay.benchmarks.report import markdown_table, num

if TYPE_CHECKING:
    from torchbay.benchmarks.sla_model import Outcome, Repeat, SlaResult, Step

Column = tuple[str, str, Callable[[Any], str]]


def _table(columns: Sequence[Column], items: Sequence[Any]) -> str:
    """A markdown table with one row per item; ``align``: ``:`` right, ``-`` left."""
    rows = [[cell(item) for _, _, cell in columns] for item in items]
    return markdown_table([h for h, _, _ in columns], rows, "".join(a for _, a, _ in columns))


def _each(values: list[float], digits: int) -> str:
    return ", ".join(num(v, digits) for v in values)


def _min_max(values: list[float], digits: int) -> str:
    return f"{num(min(values), digits)}-{num(max(values), digits)}" if values else "-"


def _best(digits: int, value: Callable[[Step], float]) -> Callable[[Outcome], str]:
    """A cell from the outcome's best step; "-" when it has none."""
    return lambda oc: num(value(oc.best_step), digits) if oc.best_step else "-"


REPEAT_COLUMNS: list[Column] = [
    ("config", "-", lambda r: r.label),
    ("rate (req/s)", ":", lambda r: f"{r.rate:,.1f}"),
    ("p99 per run (ms)", "-", lambda r: _each(r.p99_ms, 2)),
    ("p99 min-max (ms)", "-", lambda r: _min_max(r.p99_ms, 2)),
    ("p99 spread", ":", lambda r: f"{num(r.p99_spread_pct, 1)}%"),
    ("ok/s per run", "-", lambda r: _each(r.ok_per_s, 1)),
    ("ok/s min-max", "-", lambda r: _min_max(r.ok_per_s, 1)),
    ("throughput spread", ":", lambda r: f"{num(r.throughput_spread_pct, 1)}%"),
    ("SLA held per run", "-", lambda r: " ".join("yes" if p else "MISSED" for p in r.passed)),
    ("SLA held", ":", lambda r: f"{sum(r.passed)}/{len(r.passed)}"),
]
CONFIG_COLUMNS: list[Column] = [
    ("config", "-", lambda oc: oc.label),
    ("batch", ":", lambda oc: str(oc.config.batch_size)),
    ("delay (ms)", ":", lambda oc: f"{oc.config.max_batch_delay_ms:g}"),
    ("workers", ":", lambda oc: str(oc.config.workers)),
    ("probe capacity (req/s)", ":", lambda oc: num(oc.capacity, 1)),
    ("best rate (req/s)", ":", lambda oc: num(oc.best_rate, 1) if oc.best_step else "-"),
    ("ok/s at best", ":", _best(1, lambda s: s.result.ok_per_s)),
    ("p50 (ms)", ":", _best(2, lambda s: s.result.latency.p50_ms)),
    ("p99 (ms)", ":", _best(2, lambda s: s.result.latency.p99_ms)),
    ("mean batch", ":", _best(2, lambda s: s.mean_batch_size)),
    ("steps", ":", lambda oc: str(sum(s.phase in ("probe", "ramp", "bisect") for s in oc.steps))),
    ("status", "-", lambda oc: oc.status + (f" {oc.same_as}" if oc.same_as else "")),
    ("notes", "-", lambda oc: oc.why),
]


def render_markdown(result: SlaResult, command: str | None = None) -> str:
    return "\n".join(
        [
            *_head_lines(result, command),
            *_winner_lines(result),
            *_repeat_lines(result),
            "",
            "## All configurations",
            "",
            _table(CONFIG_COLUMNS, result.outcomes),
            *_method_lines(result),
            "",
            "## Files",
            "",
            "- `results.csv`: every step (probe, ramp, bisect, repeat)",
            "- `result.json`: the same, machine-readable",
            "- ![latency against throughput](latency_vs_throughput.png)",
            "- ![best throughput under the SLA](best_throughput.png)",
            "",
        ]
    )


def _head_lines(result: SlaResult, command: str | None) -> list[str]:
    o = result.options
    lines = [f"# SLA search: {result.model} (p99 <= {o.sla_p99_ms:g} ms)", ""]
    if command:
        lines += ["```", command, "```", ""]
    return [
        *lines,
        f"- archive: `{o.archive}` (model {result.model}, version {result.version})",
        f"- inputs: {', '.join(f'`{p}`' for p in o.inputs)}; route: {o.protocol}",
        f"- grid: batch sizes {list(o.batch_sizes)}, max delays (ms) {list(o.max_delays_ms)}, "
        f"workers {list(o.workers)}",
        f"- machine: {describe_machine(machine_info())}",
        f"- search took {result.elapsed_s:.0f} s; load generator: {o.processes} process(es), "
        f"{o.arrival} arrivals, {o.step_s:g} s steps after {o.step_warmup_s:g} s warm-up",
    ]


def _winner_lines(result: SlaResult) -> list[str]:
    lines = ["", "## Winner", ""]
    if result.winner is None:
        if result.note:  # met it in the search, then missed in a repeat: never crowned
            return [*lines, "No winner: " + result.note.strip(), *_autopilot_lines(result)]
        return [*lines, "No configuration met the SLA at any tested load."]
    w = result.winner
    best = w.best_step
    assert best is not None
    lines.append(
        f"**{w.label}**: batch size {w.config.batch_size}, max batch delay "
        f"{w.config.max_batch_delay_ms:g} ms, {w.config.workers} worker(s): "
        f"**{w.best_rate:,.1f} req/s** offered ({best.result.ok_per_s:,.1f} ok/s measured) "
        f"with p99 {best.result.latency.p99_ms:.2f} ms."
    )
    if result.runner_up is not None:
        r = result.runner_up
        lines.append(f"Runner-up: {r.label} at {r.best_rate:,.1f} req/s.")
    if result.swapped:
        lines.append(
            f"(The search's first pick, {result.runner_up.label if result.runner_up else '-'}, "
            "missed the SLA in a repeat; this one held it in every repeat, so it wins.)"
        )
    if result.applied:
        lines.append(f"Applied to `{result.applied}` (model-config.yaml).")
    return [*lines, *_autopilot_lines(result)]


def _autopilot_lines(result: SlaResult) -> list[str]:
    """The autopilot beside the winner: same rate, same windows, as many runs as the repeats."""
    a = result.autopilot
    pace = result.repeats[0].label if result.repeats else None  # the search's pick, no winner
    w = result.winner or next((oc for oc in result.outcomes if oc.label == pace), None)
    if a is None or w is None:
        return []
    o = result.options
    held = f"held the SLA in {sum(a.passed)} of {len(a.passed)} runs"
    state = result.autopilot_state or {}
    end = (
        f" It ended at batch {state.get('batchSize')}, delay {num(state.get('maxBatchDelay'), 1)} "
        f"ms ({_changes(state.get('changes'))})."
        if state
        else ""
    )
    own = _own_search(result.autopilot_search, w)
    return [
        "",
        f"**Autopilot** (slaP99Ms {o.sla_p99_ms:g}, ceilings batch {max(o.batch_sizes)}, delay "
        f"{max(o.max_delays_ms):g} ms, {w.config.workers} worker(s)) at {w.label}'s "
        f"{w.best_rate:,.1f} req/s: {held}; p99 {_each(a.p99_ms, 2)} ms; "
        f"{_each(a.ok_per_s, 1)} ok/s.{end}{own}",
    ]


def _changes(changes: Any) -> str:
    """The autopilot's change counts ({"up": u, "down": d}) in words."""
    if not isinstance(changes, dict):
        return "changes not reported"
    return f"{changes.get('up', 0)} changes up, {changes.get('down', 0)} down"


def _own_search(s: Outcome | None, w: Outcome) -> str:
    """The autopilot's own highest rate within the SLA, beside the winner's."""
    if s is None:
        return ""
    if s.status != "searched" or not w.best_rate > 0:
        return f" Its own rate search: {s.status}, {s.why}."
    return (
        f" Searched like a static configuration, its highest rate within the SLA is "
        f"{s.best_rate:,.1f} req/s ({num(s.best_rate / w.best_rate, 2)}x {w.label}'s): {s.why}."
    )


def _repeat_lines(result: SlaResult) -> list[str]:
    lines = ["", "## Repeats (noise)", ""]
    if not result.repeats and not result.autopilot:
        return [*lines, "No repeats were run."]
    table = _table(REPEAT_COLUMNS, [*result.repeats, *filter(None, [result.autopilot])])
    return [*lines, table, "", _verdict(result), *([result.note] if result.note else [])]


def _method_lines(result: SlaResult) -> list[str]:
    o = result.options
    count = lambda *status: sum(1 for oc in result.outcomes if oc.status in status)  # noqa: E731
    return [
        "",
        "## How it was found",
        "",
        f"{len(result.outcomes)} configurations in the grid; {count('searched', 'infeasible')} "
        f"searched, {count('skipped')} skipped by the capacity "
        f"bound, {count('same-as')} identical to another "
        "(batch size 1 ignores the delay).",
        "",
        "Each configuration was set live through the management API "
        "(`PUT /models/{m}?batch_size=&max_batch_delay=&min_worker=&max_worker="
        "&synchronous=true`), "
        "without restarting the server. A closed-loop probe "
        f"({o.probe_s:g} s at concurrency max(4, 2 x batch x workers)) measured its capacity, an "
        "upper bound on any rate it can sustain. Configurations were then searched in descending "
        "capacity: open-loop steps from half the capacity, multiplied by "
        f"{o.ramp_factor:g} until a step breached, then bisected (geometric midpoint) until the "
        f"passing and breaching rates were within {100 * o.precision:g}%. A step breaches when its "
        f"p99 exceeds {o.sla_p99_ms:g} ms or more than {100 * o.max_error_rate:g}% of its requests "
        "fail. Latency is measured from each request's scheduled send time (no coordinated "
        "omission). A configuration whose capacity (plus "
        f"{100 * o.bound_margin:g}% for probe noise) is below the best rate already found cannot "
        "win and was skipped (after a second probe, keeping the better capacity).",
    ]


def _verdict(result: SlaResult) -> str:
    reps = {rep.label: rep for rep in result.repeats}
    if result.winner is None or result.runner_up is None:
        return ""
    w, r = reps.get(result.winner.label), reps.get(result.runner_up.label)
    if w is None or r is None or not r.rate:
        return ""
    gap = 100.0 * (w.rate - r.rate) / r.rate
    noise = max(
        (x for x in (w.throughput_spread_pct, r.throughput_spread_pct) if math.isfinite(x)),
        default=math.nan,
    )
    held = (
        f"The winner held the SLA in {sum(w.passed)} of {len(w.passed)} repeats, the runner-up "
        f"in {sum(r.passed)} of {len(r.passed)}."
    )
    if gap < 0:
        return f"{held} Its rate is {-gap:.1f}% below the runner-up's search result."
    if math.isfinite(noise) and gap <= noise:
        return (
            f"{held} Its rate is {gap:.1f}% above the runner-up's, within the {noise:.1f}% "
            "throughput spread of the repeats: the two are too close to call on this machine."
        )
    return f"{held} Its rate is {gap:.1f}% above the runner-up's (repeat spread {num(noise, 1)}%)."


def _command_line() -> str:
    args = " ".join(shlex.quote(a) for a in sys.argv[1:])
    prog = sys.argv[0] if sys.argv else ""
    return f"torchbay {args}" if prog.endswith(("__main__.py", "torchbay")) else f"{prog} {args}"


def write_all(result: SlaResult, command: str | None = None) -> dict[str, Path]:
    """Write every report file into ``result.options.out_dir``; returns them by kind."""
    from torchbay.benchmarks import plots

    out = result.options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "csv": write_csv(result, out / "results.csv"),
        "latency_plot": plots.latency_vs_throughput(result, out / "latency_vs_throughput.png"),
        "best_plot": plots.best_throughput(result, out / "best_throughput.png"),
    }
    files["json"] = out / "result.json"
    files["json"].write_text(json.dumps(result_json(result), indent=2, default=str) + "\n")
    files["report"] = out / "report.md"
    files["report"].write_text(render_markdown(result, command or _command_line()))
    return files


def write_csv(result: SlaResult, path: Path) -> Path:
    rows = [step_row(step) for outcome in result.outcomes for step in outcome.steps]
    for step in result.autopilot_search.steps if result.autopilot_search else ():
        # the autopilot's own search, at its ceilings
        rows.append({**step_row(step), "config": f"autopilot {step.config.label()}"})
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["config"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def _config_json(oc: Outcome | Step) -> dict[str, Any]:
    c = oc.config
    return {
        "config": c.label(),
        "batch_size": c.batch_size,
        "max_delay_ms": c.max_batch_delay_ms,
        "workers": c.workers,
    }


def step_row(step: Step) -> dict[str, Any]:
    r = step.result
    latency = {k: round(v, 3) for k, v in r.latency.as_dict().items() if k.startswith(("p", "max"))}
    return {
        **_config_json(step),
        "phase": step.phase,
        "offered_rate": round(step.offered_rate, 3),
        "ok_per_s": round(r.ok_per_s, 3) if math.isfinite(r.ok_per_s) else "",
        "sent": r.sent,
        "ok": r.ok,
        "error_rate": round(r.error_rate, 6),
        **latency,
        "passed": int(step.passed),
        "reason": step.reason,
        "statuses": " ".join(f"{k}:{v}" for k, v in r.statuses.items()),
        "mean_batch_size": round(step.mean_batch_size, 3),
        "queue_mean_ms": round(step.queue_mean_ms, 3),
        "lag_p99_ms": round(r.lag.p99_ms, 3),
    }


def _outcome_json(oc: Outcome) -> dict[str, Any]:
    return {
        **_config_json(oc),
        "status": oc.status,
        "why": oc.why,
        "capacity": oc.capacity,
        "best_rate": oc.best_rate,
        "steps": [step_row(s) for s in oc.steps],
    }


def _repeat_json(rep: Repeat) -> dict[str, Any]:
    return {"rate": rep.rate, "p99_ms": rep.p99_ms, "ok_per_s": rep.ok_per_s, "passed": rep.passed}


def result_json(result: SlaResult) -> dict[str, Any]:
    auto, search = result.autopilot, result.autopilot_search
    return {
        "model": result.model,
        "version": result.version,
        "sla_p99_ms": result.options.sla_p99_ms,
        "machine": machine_info(),
        "elapsed_s": result.elapsed_s,
        "winner": result.winner.label if result.winner else None,
        "runner_up": result.runner_up.label if result.runner_up else None,
        "configurations": [_outcome_json(oc) for oc in result.outcomes],
        "repeats": [{"config": rep.label, **_repeat_json(rep)} for rep in result.repeats],
        "autopilot": None
        if auto is None
        else {
            **_repeat_json(auto),
            "state": result.autopilot_state,
            "search": _outcome_json(search) if search else None,
        },
        "applied": str(result.applied) if result.applied else None,
    }
