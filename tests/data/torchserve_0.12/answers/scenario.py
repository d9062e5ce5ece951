"""The ``answers`` record's scenario, shared by record.py (TorchServe 0.12) and
tests/server/test_management_answers.py (torchbay): what the management API answers about a
worker busy with a request (held by ../busy/gate_handler.py's gate), what a describe of the
handler (``?customized=true``) counts, and an unregister that meets the busy worker with
``unregister_model_timeout`` at ``UNREGISTER_TIMEOUT_S``.

Standard library only (the recorder runs it in TorchServe's virtualenv). ``call(method, url,
body)`` is the caller's HTTP client: (status, body as JSON or text) for any status.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[1] / "busy") not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parents[1] / "busy"))  # gating
from gating import WAIT_S, Call, hold, until

ARCHIVES = {"m.mar": ("m", "1.0", "../busy/gate_handler.py")}  # file: model, version, handler
UNREGISTER_TIMEOUT_S = 2


def _requests_total(call: Call, metrics: str) -> float:
    """The sum of ``ts_inference_requests_total`` samples of model m (0: none yet)."""
    status, text = call("GET", f"{metrics}/metrics", None)
    assert status == 200, text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in str(text).splitlines()
        if line.startswith("ts_inference_requests_total{") and 'model_name="m"' in line
    )


def _held(call: Call, inference: str, gates: Path, name: str) -> tuple[threading.Thread, list]:
    """A request that m's handler holds until ``gates/name`` exists, once it has begun."""
    started, gate = gates / f"{name}-started", gates / name
    body = hold(started, gate)
    out: list = []

    def send() -> None:
        try:
            out.append(call("POST", f"{inference}/predictions/m", body))
        except OSError as exc:  # TorchServe: reset when it stops, the request never answered
            out.append(f"no answer: {type(exc).__name__}")

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    until(started.exists)
    return thread, out


def run(call: Call, inference: str, management: str, metrics: str, gates: Path) -> dict:
    """Every step's answer by id."""
    answers: dict[str, Any] = {}
    m = f"{management}/models/m"
    reg = f"{management}/models?url=m.mar&initial_workers=1&synchronous=true"
    answers["register"] = call("POST", reg, None)
    thread, out = _held(call, inference, gates, "first")
    status, described = call("GET", m, None)
    answers["busy_worker_status"] = [w["status"] for w in described[0]["workers"]]
    (gates / "first").touch()
    thread.join(WAIT_S)
    answers["first_request"] = out[0] if out else "no answer"
    before = _requests_total(call, metrics)
    status, customized = call("GET", f"{m}?customized=true", None)
    answers["customized_describe"] = [status, customized[0].get("customizedMetadata")]
    answers["customized_counted"] = _requests_total(call, metrics) - before
    thread, out = _held(call, inference, gates, "second")
    began = time.monotonic()
    answers["unregister_busy"] = call("DELETE", m, None)
    took = time.monotonic() - began
    answers["unregister_within_timeout"] = took < UNREGISTER_TIMEOUT_S + 6  # a loaded host
    answers["described_after"] = call("GET", m, None)
    (gates / "second").touch()
    thread.join(WAIT_S)
    answers["second_request"] = out[0] if out else "no answer"
    return {k: list(v) if isinstance(v, tuple) else v for k, v in answers.items()}
