"""What ``results.csv`` and ``result.json`` of an SLA search hold: one CSV row per measured step
(:func:`step_row`, columns :data:`CSV_COLUMNS`) and the whole search as JSON
(:func:`result_json`). ``sla_report.py`` writes them beside ``report.md``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from torchbay.benchmarks.procstat import machine_info

if TYPE_CHECKING:
    from torchbay.benchmarks.sla_model import Outcome, SlaResult, Step

CSV_COLUMNS = (
    "config",
    "batch_size",
    "max_delay_ms",
    "workers",
    "phase",
    "offered_rate",
    "ok_per_s",
    "sent",
    "ok",
    "error_rate",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "p99.9_ms",
    "max_ms",
    "passed",
    "reason",
    "statuses",
    "mean_batch_size",
    "queue_mean_ms",
    "lag_p99_ms",
)


def step_row(step: Step) -> dict[str, Any]:
    r = step.result
    c = step.config
    return {
        "config": c.label(),
        "batch_size": c.batch_size,
        "max_delay_ms": c.max_batch_delay_ms,
        "workers": c.workers,
        "phase": step.phase,
        "offered_rate": round(step.offered_rate, 3),
        "ok_per_s": round(r.ok_per_s, 3) if math.isfinite(r.ok_per_s) else "",
        "sent": r.sent,
        "ok": r.ok,
        "error_rate": round(r.error_rate, 6),
        "p50_ms": round(r.latency.p50_ms, 3),
        "p90_ms": round(r.latency.p90_ms, 3),
        "p99_ms": round(r.latency.p99_ms, 3),
        "p99.9_ms": round(r.latency.p999_ms, 3),
        "max_ms": round(r.latency.max_ms, 3),
        "passed": int(step.passed),
        "reason": step.reason,
        "statuses": " ".join(f"{k}:{v}" for k, v in r.statuses.items()),
        "mean_batch_size": round(step.mean_batch_size, 3),
        "queue_mean_ms": round(step.queue_mean_ms, 3),
        "lag_p99_ms": round(r.lag.p99_ms, 3),
    }


def _outcome_json(oc: Outcome) -> dict[str, Any]:
    return {
        "config": oc.label,
        "batch_size": oc.config.batch_size,
        "max_delay_ms": oc.config.max_batch_delay_ms,
        "workers": oc.config.workers,
        "status": oc.status,
        "why": oc.why,
        "capacity": oc.capacity,
        "best_rate": oc.best_rate,
        "steps": [step_row(s) for s in oc.steps],
    }


def result_json(result: SlaResult) -> dict[str, Any]:
    return {
        "model": result.model,
        "version": result.version,
        "sla_p99_ms": result.options.sla_p99_ms,
        "machine": machine_info(),
        "elapsed_s": result.elapsed_s,
        "winner": result.winner.label if result.winner else None,
        "runner_up": result.runner_up.label if result.runner_up else None,
        "configurations": [_outcome_json(oc) for oc in result.outcomes],
        "repeats": [
            {
                "config": rep.label,
                "rate": rep.rate,
                "p99_ms": rep.p99_ms,
                "ok_per_s": rep.ok_per_s,
                "passed": rep.passed,
            }
            for rep in result.repeats
        ],
        "autopilot": None
        if result.autopilot is None
        else {
            "rate": result.autopilot.rate,
            "p99_ms": result.autopilot.p99_ms,
            "ok_per_s": result.autopilot.ok_per_s,
            "passed": result.autopilot.passed,
            "state": result.autopilot_state,
            "search": _outcome_json(result.autopilot_search) if result.autopilot_search else None,
        },
        "applied": str(result.applied) if result.applied else None,
    }
