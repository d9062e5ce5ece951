"""The call sequence TorchServe users script, shared by ``record.py`` (run against TorchServe
0.12) and tests/server/test_torchserve_parity.py (run against torchbay): the steps, and the one
normalisation both apply to an answer before it is recorded or compared. Standard library only.

A step is ``(id, method, listener, path)`` plus options: ``body`` (bytes, sent as text/plain)
and ``until`` ("ready": repeat the call until every worker of the described model is READY,
bounded). Listeners: ``inference``, ``management``, ``metrics``.
"""

from __future__ import annotations

import json
import re
from typing import Any

# The model store of both runs: tiny.mar (tiny 1.0), tiny-v2.mar (tiny 2.0), slow.mar (slow
# 1.0, its handler sleeps 4 s while loading) and not_an_archive.mar (text, not a zip).
ARCHIVES = {
    "tiny.mar": ("tiny", "1.0", "parity_handler.py"),
    "tiny-v2.mar": ("tiny", "2.0", "parity_handler.py"),
    "slow.mar": ("slow", "1.0", "slow_handler.py"),
}
NOT_AN_ARCHIVE = "not_an_archive.mar"

INF, M, X = "inference", "management", "metrics"
HI = b"hi"

STEPS: list[dict[str, Any]] = [
    {"id": "ping_no_model", "method": "GET", "listener": INF, "path": "/ping"},
    {"id": "list_empty", "method": "GET", "listener": M, "path": "/models"},
    {"id": "register_no_url", "method": "POST", "listener": M, "path": "/models"},
    {"id": "register_empty_url", "method": "POST", "listener": M, "path": "/models?url="},
    {"id": "register_missing_file", "method": "POST", "listener": M,
     "path": "/models?url=missing.mar"},
    {"id": "register_not_an_archive", "method": "POST", "listener": M,
     "path": f"/models?url={NOT_AN_ARCHIVE}"},
    {"id": "register_unknown_runtime", "method": "POST", "listener": M,
     "path": "/models?url=tiny.mar&runtime=bogus"},
    {"id": "register_junk_numbers", "method": "POST", "listener": M,
     "path": "/models?url=tiny.mar&initial_workers=abc&batch_size=abc&max_batch_delay=abc"
             "&response_timeout=abc&synchronous=abc"},
    {"id": "describe_junk_numbers", "method": "GET", "listener": M, "path": "/models/tiny"},
    {"id": "unregister_junk_numbers", "method": "DELETE", "listener": M, "path": "/models/tiny"},
    {"id": "register_negative_numbers", "method": "POST", "listener": M,
     "path": "/models?url=tiny.mar&initial_workers=-1&batch_size=-1&max_batch_delay=-1"
             "&response_timeout=-1"},
    {"id": "describe_negative_numbers", "method": "GET", "listener": M, "path": "/models/tiny"},
    {"id": "unregister_negative_numbers", "method": "DELETE", "listener": M,
     "path": "/models/tiny"},
    {"id": "register_settings", "method": "POST", "listener": M,
     "path": "/models?url=tiny.mar&batch_size=4&max_batch_delay=50&response_timeout=30"
             "&runtime=python"},
    {"id": "describe_settings", "method": "GET", "listener": M, "path": "/models/tiny"},
    {"id": "unregister_settings", "method": "DELETE", "listener": M, "path": "/models/tiny"},
    {"id": "register_default", "method": "POST", "listener": M, "path": "/models?url=tiny.mar"},
    {"id": "ping_no_worker", "method": "GET", "listener": INF, "path": "/ping"},
    {"id": "describe_no_worker", "method": "GET", "listener": M, "path": "/models/tiny"},
    {"id": "predict_no_worker", "method": "POST", "listener": INF, "path": "/predictions/tiny",
     "body": HI},
    {"id": "register_conflict", "method": "POST", "listener": M, "path": "/models?url=tiny.mar"},
    {"id": "scale_up_sync", "method": "PUT", "listener": M,
     "path": "/models/tiny?min_worker=1&synchronous=true"},
    {"id": "describe_one_worker", "method": "GET", "listener": M, "path": "/models/tiny"},
    {"id": "ping_one_worker", "method": "GET", "listener": INF, "path": "/ping"},
    {"id": "predict", "method": "POST", "listener": INF, "path": "/predictions/tiny", "body": HI},
    {"id": "predict_version", "method": "POST", "listener": INF, "path": "/predictions/tiny/1.0",
     "body": HI},
    {"id": "predict_unknown_version", "method": "POST", "listener": INF,
     "path": "/predictions/tiny/9.9", "body": HI},
    {"id": "predict_unknown_model", "method": "POST", "listener": INF,
     "path": "/predictions/nope", "body": HI},
    {"id": "scale_up_two_sync", "method": "PUT", "listener": M,
     "path": "/models/tiny?min_worker=2&synchronous=true"},
    {"id": "describe_two_workers", "method": "GET", "listener": M, "path": "/models/tiny"},
    {"id": "scale_down_sync", "method": "PUT", "listener": M,
     "path": "/models/tiny?min_worker=1&synchronous=true"},
    {"id": "scale_version_sync", "method": "PUT", "listener": M,
     "path": "/models/tiny/1.0?min_worker=1&synchronous=true"},
    {"id": "scale_junk_numbers", "method": "PUT", "listener": M,
     "path": "/models/tiny?min_worker=abc&max_worker=abc&synchronous=true"},
    {"id": "scale_negative_min_worker", "method": "PUT", "listener": M,
     "path": "/models/tiny?min_worker=-1&synchronous=true"},
    {"id": "scale_junk_timeout", "method": "PUT", "listener": M,
     "path": "/models/tiny?min_worker=1&timeout=abc&synchronous=true"},
    {"id": "scale_max_below_min", "method": "PUT", "listener": M,
     "path": "/models/tiny?min_worker=2&max_worker=1&synchronous=true"},
    {"id": "scale_async", "method": "PUT", "listener": M, "path": "/models/tiny?min_worker=1"},
    {"id": "scale_unknown_model", "method": "PUT", "listener": M,
     "path": "/models/nope?min_worker=1&synchronous=true"},
    {"id": "describe_after_scaling", "method": "GET", "listener": M, "path": "/models/tiny",
     "until": "ready"},
    {"id": "register_v2", "method": "POST", "listener": M,
     "path": "/models?url=tiny-v2.mar&initial_workers=1&synchronous=true"},
    {"id": "describe_all", "method": "GET", "listener": M, "path": "/models/tiny/all"},
    {"id": "set_default_v2", "method": "PUT", "listener": M,
     "path": "/models/tiny/2.0/set-default"},
    {"id": "set_default_unknown_version", "method": "PUT", "listener": M,
     "path": "/models/tiny/9.9/set-default"},
    {"id": "set_default_unknown_model", "method": "PUT", "listener": M,
     "path": "/models/nope/1.0/set-default"},
    {"id": "describe_default_v2", "method": "GET", "listener": M, "path": "/models/tiny"},
    {"id": "predict_default_v2", "method": "POST", "listener": INF, "path": "/predictions/tiny",
     "body": HI},
    {"id": "unregister_default_in_use", "method": "DELETE", "listener": M,
     "path": "/models/tiny/2.0"},
    {"id": "unregister_unknown_version", "method": "DELETE", "listener": M,
     "path": "/models/tiny/9.9"},
    {"id": "unregister_unknown_model", "method": "DELETE", "listener": M, "path": "/models/nope"},
    {"id": "describe_unknown_model", "method": "GET", "listener": M, "path": "/models/nope"},
    {"id": "describe_unknown_version", "method": "GET", "listener": M,
     "path": "/models/tiny/9.9"},
    {"id": "register_model_name", "method": "POST", "listener": M,
     "path": "/models?url=tiny.mar&model_name=renamed"},
    {"id": "describe_model_name", "method": "GET", "listener": M, "path": "/models/renamed"},
    {"id": "list_all", "method": "GET", "listener": M, "path": "/models"},
    {"id": "list_limit_1", "method": "GET", "listener": M, "path": "/models?limit=1"},
    {"id": "list_page_2", "method": "GET", "listener": M,
     "path": "/models?limit=1&next_page_token=1"},
    {"id": "list_limit_0", "method": "GET", "listener": M, "path": "/models?limit=0"},
    {"id": "list_limit_negative", "method": "GET", "listener": M, "path": "/models?limit=-1"},
    {"id": "list_limit_junk", "method": "GET", "listener": M, "path": "/models?limit=abc"},
    {"id": "list_limit_large", "method": "GET", "listener": M, "path": "/models?limit=1000"},
    {"id": "list_token_junk", "method": "GET", "listener": M,
     "path": "/models?next_page_token=abc"},
    {"id": "list_token_negative", "method": "GET", "listener": M,
     "path": "/models?next_page_token=-1"},
    {"id": "list_token_past_end", "method": "GET", "listener": M,
     "path": "/models?next_page_token=5"},
    {"id": "unregister_model_name", "method": "DELETE", "listener": M,
     "path": "/models/renamed"},
    {"id": "register_slow_async", "method": "POST", "listener": M,
     "path": "/models?url=slow.mar&initial_workers=1&synchronous=false"},
    {"id": "scale_while_loading", "method": "PUT", "listener": M,
     "path": "/models/slow?min_worker=1&synchronous=true"},
    {"id": "describe_slow_ready", "method": "GET", "listener": M, "path": "/models/slow",
     "until": "ready"},
    {"id": "predict_slow", "method": "POST", "listener": INF, "path": "/predictions/slow",
     "body": HI},
    {"id": "metrics", "method": "GET", "listener": X, "path": "/metrics"},
    {"id": "unregister_slow", "method": "DELETE", "listener": M, "path": "/models/slow"},
    {"id": "unregister_v1", "method": "DELETE", "listener": M, "path": "/models/tiny/1.0"},
    {"id": "unregister_last_version", "method": "DELETE", "listener": M,
     "path": "/models/tiny/2.0"},
    {"id": "list_after", "method": "GET", "listener": M, "path": "/models"},
    {"id": "ping_after", "method": "GET", "listener": INF, "path": "/ping"},
    {"id": "unknown_path", "method": "GET", "listener": M, "path": "/nope"},
]  # fmt: skip

# Describe fields whose values change from run to run.
_VOLATILE_WORKER = ("id", "startTime", "memoryUsage", "pid", "gpuUsage")
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
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
    types: dict[str, str] = {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            types[family] = kind
            continue
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        labels = [
            [k, "<host>" if k.lower() == "hostname" else v]
            for k, v in _LABEL.findall(match["labels"] or "")
        ]
        value: Any = float(match["value"]) if match["name"] in COUNTED else "<value>"
        samples.append([match["name"], labels, value])
    return {"types": types, "samples": sorted(samples, key=json.dumps)}
