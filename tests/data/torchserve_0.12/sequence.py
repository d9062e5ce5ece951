"""The call sequence TorchServe users script, shared by ``record.py`` (run against TorchServe
0.12) and tests/server/test_torchserve_parity.py (run against torchbay): the steps, and the one
normalisation both apply to an answer before it is recorded or compared. Standard library only.

The steps are data, in steps.json. A step is ``{id, method, listener, path}`` plus options:
``body`` (text there, bytes here, sent as text/plain) and ``until`` ("ready": repeat the call
until every worker of the described model is READY, bounded). Listeners: ``inference``,
``management``, ``metrics``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# tsrun: the recorders' shared module, whose metrics normalisation this one applies.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torchserve"))
import tsrun

# The model store of both runs: tiny.mar (tiny 1.0), tiny-v2.mar (tiny 2.0), slow.mar (slow
# 1.0, its handler sleeps 4 s while loading) and not_an_archive.mar (text, not a zip).
ARCHIVES = {
    "tiny.mar": ("tiny", "1.0", "parity_handler.py"),
    "tiny-v2.mar": ("tiny", "2.0", "parity_handler.py"),
    "slow.mar": ("slow", "1.0", "slow_handler.py"),
}
NOT_AN_ARCHIVE = "not_an_archive.mar"

INF, M, X = "inference", "management", "metrics"
# The steps, in order.
STEPS: list[dict[str, Any]] = [
    {**step, "body": step["body"].encode()} if "body" in step else step
    for step in json.loads(Path(__file__).with_name("steps.json").read_text())
]

# Describe fields whose values change from run to run.
_VOLATILE_WORKER = ("id", "startTime", "memoryUsage", "pid", "gpuUsage")
# Metric values kept as recorded (counts); every other value becomes "<value>".
COUNTED = ("ts_inference_requests_total", "Requests2XX", "Requests4XX", "Requests5XX")


def ready(body: Any) -> bool:
    """``until: ready``: every worker of every described version is READY (and there is one)."""
    if not isinstance(body, list) or not body:
        return False
    workers = [w for entry in body if isinstance(entry, dict) for w in entry.get("workers", [])]
    return bool(workers) and all(w.get("status") == "READY" for w in workers)


def normalise(step: dict[str, Any], content_type: str, raw: bytes) -> Any:
    """The recorded form of an answer body: JSON with volatile values replaced, metrics text
    as {"types": {family: type}, "samples": [[name, [[label, value], ...], value], ...]}."""
    if step["listener"] == X:
        return metrics(raw.decode())
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return {"text": text}
    if isinstance(body, list):
        for entry in body:
            for worker in entry.get("workers", []) if isinstance(entry, dict) else []:
                for key in _VOLATILE_WORKER:
                    if key in worker:
                        worker[key] = f"<{key}>"
    return body


def metrics(text: str) -> dict[str, Any]:
    """A /metrics body as {"types": {family: type}, "samples": sorted [name, labels, value]}."""
    types, samples = tsrun.prometheus_text(text, COUNTED, _label)
    return {"types": types, "samples": sorted(samples, key=json.dumps)}


def _label(name: str, value: str) -> str:
    return "<host>" if name.lower() == "hostname" else value
