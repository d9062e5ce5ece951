"""The calls of the metrics-mode records, shared by ``record.py`` (run against TorchServe 0.12)
and tests/server/test_metrics_modes.py (run against torchbay), with the cases (config lines per
metrics mode) and the normalisation both apply before recording or comparing. Standard library.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

# tsrun: the recorders' shared module, whose metrics normalisation this one applies.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import tsrun

ARCHIVE = "counted.mar"  # model "counted" 1.0, handler metrics_handler.py over a tiny model
INF, M, X = "inference", "management", "metrics"

STEPS: list[dict[str, Any]] = [
    {"id": "ping", "method": "GET", "listener": INF, "path": "/ping"},
    {"id": "register", "method": "POST", "listener": M,
     "path": f"/models?url={ARCHIVE}&initial_workers=1&synchronous=true"},
    {"id": "predict", "method": "POST", "listener": INF, "path": "/predictions/counted",
     "body": b"hi"},
    {"id": "predict_again", "method": "POST", "listener": INF,
     "path": "/predictions/counted/1.0", "body": b"hi"},
    {"id": "predict_bad", "method": "POST", "listener": INF, "path": "/predictions/counted",
     "body": b"bad"},
    {"id": "predict_unknown_model", "method": "POST", "listener": INF,
     "path": "/predictions/nope", "body": b"hi"},
    {"id": "list", "method": "GET", "listener": M, "path": "/models"},
    {"id": "register_no_url", "method": "POST", "listener": M, "path": "/models"},
    {"id": "unknown_path", "method": "GET", "listener": INF, "path": "/nope"},
    {"id": "metrics", "method": "GET", "listener": X, "path": "/metrics"},
    {"id": "metrics_again", "method": "GET", "listener": X, "path": "/metrics"},
    {"id": "metrics_named", "method": "GET", "listener": X,
     "path": "/metrics?name[]=Requests2XX&name[]=HandlerTime"},
]  # fmt: skip

# case -> config.properties lines (besides the addresses; every case: no system metrics).
CASES: dict[str, dict[str, str]] = {
    "log": {"metrics_mode": "log"},
    "prometheus": {"metrics_mode": "prometheus"},
    "legacy": {"metrics_mode": "legacy"},
    "custom_config": {"metrics_mode": "prometheus", "metrics_config": "custom_metrics.yaml"},
    "auto_detect": {"metrics_mode": "prometheus", "model_metrics_auto_detect": "true"},
    "log_auto_detect": {"metrics_mode": "log", "model_metrics_auto_detect": "true"},
}

_WORKER = re.compile(r"W-\d+-")  # TorchServe numbers workers from 9000, torchbay from 1
# Values kept as recorded (counts); every other value (a time) becomes "<value>".
COUNTED = frozenset(
    ("ts_inference_requests_total", "Requests2XX", "Requests4XX", "Requests5XX", "InferenceCount")
)
# A ts_metrics.log / model_metrics.log line, less log4j's date prefix:
# Name.Unit:value|#Dim:v,Dim:v|#hostname:host[,requestID:ids],timestamp:seconds
_LINE = re.compile(
    r"(?P<name>[^.|]+)\.(?P<unit>[^:|]*):(?P<value>[^|]+)\|#(?P<dims>[^|]*)"
    r"\|#hostname:(?P<host>[^,]*)(?P<rid>,requestID:[^,]*(?:,[^,]*)*?)?,timestamp:\d+$"
)


def metrics_text(text: str) -> dict[str, Any]:
    """A /metrics body as {"types": {family: type}, "samples": sorted [name, labels, value]}."""
    types, samples = tsrun.prometheus_text(text, COUNTED, _label)
    return {"types": types, "samples": sorted(samples, key=repr)}


def _label(name: str, value: str) -> str:
    """A label's value less what differs from run to run: the host, a worker's number."""
    if name.lower() == "hostname":
        return "<host>"
    return _WORKER.sub("W-<n>-", value) if name == "WorkerName" else value


def log_line(line: str) -> str | None:
    """A metrics log line with its date prefix, host, request ids, timestamp and timed value
    replaced by placeholders (None: not a metric line)."""
    line = line.split(" - ", 1)[-1].strip()
    match = _LINE.match(line)
    if match is None:
        return None
    value = match["value"] if match["name"] in COUNTED else "<value>"
    dims = _WORKER.sub("W-<n>-", match["dims"])
    rid = ",requestID:<ids>" if match["rid"] else ""
    return f"{match['name']}.{match['unit']}:{value}|#{dims}|#hostname:<host>{rid},timestamp:<ts>"


def log_lines(text: str) -> list[str]:
    """The normalised metric lines of a log, sorted (threads write them in any order)."""
    return sorted(n for n in (log_line(line) for line in text.splitlines()) if n is not None)
