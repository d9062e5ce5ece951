"""The files of an SLA search: ``report.md``, ``results.csv`` (one row per measured step, so every
point of the plots can be checked), ``result.json`` and the plots."""

from __future__ import annotations

import csv
import json
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from torchbay.benchmarks import plots
from torchbay.benchmarks.procstat import describe_machine, machine_info
from torchbay.benchmarks.report import markdown_table, num
from torchbay.benchmarks.stats import spread_pct

if TYPE_CHECKING:
    from torchbay.benchmarks.sla_model import Outcome, SlaOptions, SlaResult, Step

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
    ("p99 spread", ":", lambda r: f"{num(spread_pct(r.p99_ms), 1)}%"),
    ("ok/s per run", "-", lambda r: _each(r.ok_per_s, 1)),
    ("ok/s min-max", "-", lambda r: _min_max(r.ok_per_s, 1)),
    ("throughput spread", ":", lambda r: f"{num(spread_pct(r.ok_per_s), 1)}%"),
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
    ("status", "-", lambda oc: oc.status + (f" {oc.same_as.label}" if oc.same_as else "")),
    ("notes", "-", lambda oc: oc.why),
]


def render_markdown(result: SlaResult, command: str | None = None) -> str:
    statuses = [oc.status for oc in result.outcomes]
    sections = {
        "Winner": _facts(_winner_facts(result) | _autopilot_facts(result)),
        "Repeats (noise)": _repeat_lines(result),
        "All configurations": [_table(CONFIG_COLUMNS, result.outcomes)],
        "How it was found": _facts(_method_facts(result.options, statuses)),
        "Files": [
            "- `results.csv`: every step (probe, ramp, bisect, repeat)",
            "- `result.json`: the same, machine-readable",
            "- ![latency against throughput](latency_vs_throughput.png)",
            "- ![best throughput under the SLA](best_throughput.png)",
        ],
    }
    lines = _head_lines(result, command)
    for title, body in sections.items():
        lines += ["", f"## {title}", "", *body]
    return "\n".join([*lines, ""])


def _facts(facts: dict[str, str | None]) -> list[str]:
    """One ``- name: value`` line per fact; a fact whose value is None is left out."""
    return [f"- {name}: {value}" for name, value in facts.items() if value is not None]


def _head_lines(result: SlaResult, command: str | None) -> list[str]:
    o = result.options
    code = ["```", command, "```", ""] if command else []
    facts = {
        "archive": f"`{o.archive}` (model {result.model}, version {result.version})",
        "inputs": f"{', '.join(f'`{p}`' for p in o.inputs)}; route: {o.protocol}",
        "grid": f"batch sizes {list(o.batch_sizes)}, max delays (ms) "
        f"{list(o.max_delays_ms)}, workers {list(o.workers)}",
        "machine": describe_machine(machine_info()),
        "search took": f"{result.elapsed_s:.0f} s",
        "INTERRUPTED": "a partial search (Ctrl-C or SIGTERM): what it measured until then"
        if result.interrupted
        else None,
        "load generator": f"{o.processes} process(es), {o.arrival} arrivals, {o.step_s:g} s "
        f"steps after {o.step_warmup_s:g} s warm-up",
    }
    return [f"# SLA search: {result.model} (p99 <= {o.sla_p99_ms:g} ms)", "", *code, *_facts(facts)]


def _winner_facts(result: SlaResult) -> dict[str, str | None]:
    w, r = result.winner, result.runner_up
    if w is None or w.best_step is None:  # none met the SLA, or none held it in every repeat
        why = "no configuration met the SLA at any load"
        return {"No winner": result.note.strip() or ("interrupted" if result.interrupted else why)}
    best, c = w.best_step.result, w.config
    return {
        "winner": f"**{w.label}**: batch size {c.batch_size}, max batch delay "
        f"{c.max_batch_delay_ms:g} ms, {c.workers} worker(s)",
        "best rate": f"**{w.best_rate:,.1f} req/s** offered ({best.ok_per_s:,.1f} ok/s "
        f"measured) with p99 {best.latency.p99_ms:.2f} ms",
        "runner-up": f"{r.label} at {r.best_rate:,.1f} req/s" if r else None,
        "first pick, missed the SLA in a repeat": r.label if r and result.swapped else None,
        "applied to": f"`{result.applied}` (model-config.yaml)" if result.applied else None,
    }


def _autopilot_facts(result: SlaResult) -> dict[str, str | None]:
    """The autopilot beside the winner: same rate, same windows, as many runs as the repeats."""
    a, s = result.autopilot, result.autopilot_search
    w = result.pace
    if a is None or w is None:
        return {}
    o, c, state = result.options, a.config, result.autopilot_state or {}  # c: its ceilings
    moves = state.get("changes")
    if isinstance(moves, dict):
        moves = f"{moves.get('up', 0)} changes up, {moves.get('down', 0)} down"
    ratio = f"{num(s.best_rate / w.best_rate, 2)}x" if s and w.best_rate > 0 else "-"
    return {
        "**Autopilot**": f"(slaP99Ms {o.sla_p99_ms:g}, ceilings batch {c.batch_size}, delay "
        f"{c.max_batch_delay_ms:g} ms, {c.workers} worker(s)) at {w.label}'s {w.best_rate:,.1f} "
        "req/s",
        "autopilot runs that held the SLA": f"{sum(a.passed)} of {len(a.passed)}; p99 "
        f"{_each(a.p99_ms, 2)} ms; {_each(a.ok_per_s, 1)} ok/s",
        "autopilot's end state": f"batch {state.get('batchSize')}, delay "
        f"{num(state.get('maxBatchDelay'), 1)} ms ({moves or 'changes not reported'})"
        if state
        else None,
        "autopilot's highest rate within the SLA": s
        and f"{s.status}: {num(s.best_rate, 1)} req/s ({ratio} {w.label}'s): {s.why}",
    }


def _repeat_lines(result: SlaResult) -> list[str]:
    if not result.repeats and not result.autopilot:
        return ["No repeats were run."]
    table = _table(REPEAT_COLUMNS, [*result.repeats, *filter(None, [result.autopilot])])
    return [table, "", *_facts(_verdict(result) | {"note": result.note or None})]


def _method_facts(o: SlaOptions, statuses: list[str]) -> dict[str, str | None]:
    """The method in one line (sla.py's docstring says why) and the settings it ran with."""
    count = lambda *status: sum(s in status for s in statuses)  # noqa: E731
    return {
        "configurations": f"{len(statuses)} in the grid; {count('searched', 'infeasible')} "
        f"searched, {count('skipped')} skipped by the capacity bound, {count('same-as')} "
        "identical to another (batch size 1 ignores the delay)",
        "method": "each set live (`PUT /models/{m}?...&synchronous=true`); a closed-loop probe "
        "at concurrency max(4, 2 x batch x workers) bounds its capacity; in descending "
        "capacity, open-loop steps ramp from half of it until one breaches, then bisect "
        "(geometric midpoint); one whose capacity is below the best rate so far is skipped",
        "settings": f"probe {o.probe_s:g} s, ramp x {o.ramp_factor:g}, precision "
        f"{100 * o.precision:g}%, a breach: p99 over {o.sla_p99_ms:g} ms or over "
        f"{100 * o.max_error_rate:g}% errors (latency from each request's scheduled send), "
        f"skip margin {100 * o.bound_margin:g}% (the better of two probes)",
    }


def _verdict(result: SlaResult) -> dict[str, str | None]:
    """The winner's repeats against the runner-up's: too close to call within their spread."""
    w, r = result.winner, result.runner_up
    if not (w and w.runs and r and r.runs and r.rate):  # both repeated
        return {}
    gap = 100.0 * (w.rate - r.rate) / r.rate
    spreads = (spread_pct(w.ok_per_s), spread_pct(r.ok_per_s))
    noise = max((x for x in spreads if math.isfinite(x)), default=math.nan)
    return {
        "repeats that held the SLA": f"winner {sum(w.passed)} of {len(w.passed)}, runner-up "
        f"{sum(r.passed)} of {len(r.passed)}",
        "winner's rate against the runner-up's": f"{gap:+.1f}% (repeat spread {num(noise, 1)}%)",
        "too close to call on this machine": "yes" if 0 <= gap <= noise else None,
    }


def _command_line() -> str:
    args = shlex.join(sys.argv[1:])
    prog = sys.argv[0] if sys.argv else ""
    return f"torchbay {args}" if prog.endswith(("__main__.py", "torchbay")) else f"{prog} {args}"


def write_all(result: SlaResult) -> None:
    """Write every report file into ``result.options.out_dir`` (``run_sla`` made it)."""
    out = result.options.out_dir
    rows = [step_row(step) for outcome in result.outcomes for step in outcome.steps]
    for step in result.autopilot_search.steps if result.autopilot_search else ():
        # the autopilot's own search, at its ceilings
        rows.append({**step_row(step), "config": f"autopilot {step.config.label()}"})
    with (out / "results.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["config"])
        writer.writeheader()
        writer.writerows(rows)
    plots.latency_vs_throughput(result, out / "latency_vs_throughput.png")
    plots.best_throughput(result, out / "best_throughput.png")
    (out / "result.json").write_text(json.dumps(result_json(result), indent=2, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(result, _command_line()))


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
    facts = {name: getattr(oc, name) for name in ("status", "why", "capacity", "best_rate")}
    return {**_config_json(oc), **facts, "steps": [step_row(s) for s in oc.steps]}


def _repeat_json(rep: Outcome) -> dict[str, Any]:
    return {name: getattr(rep, name) for name in ("rate", "p99_ms", "ok_per_s", "passed")}


def result_json(result: SlaResult) -> dict[str, Any]:
    search = result.autopilot_search
    autopilot = result.autopilot and {
        **_repeat_json(result.autopilot),
        "state": result.autopilot_state,
        "search": _outcome_json(search) if search else None,
    }
    return {
        "model": result.model,
        "version": result.version,
        "sla_p99_ms": result.options.sla_p99_ms,
        "machine": machine_info(),
        "elapsed_s": result.elapsed_s,
        "interrupted": result.interrupted,
        "winner": result.winner.label if result.winner else None,
        "runner_up": result.runner_up.label if result.runner_up else None,
        "configurations": [_outcome_json(oc) for oc in result.outcomes],
        "repeats": [{"config": rep.label, **_repeat_json(rep)} for rep in result.repeats],
        "autopilot": autopilot,
        "applied": str(result.applied) if result.applied else None,
    }
