"""The ``busy`` record's scenario, shared by record.py (TorchServe 0.12) and
tests/server/test_management_busy.py (torchbay): management calls that meet a version while it
is being unregistered, its worker busy with a request held by gate_handler.py's gate.

Standard library only (the recorder runs it in TorchServe's virtualenv). ``call(method, url,
body)`` is the caller's HTTP client: (status, body as JSON or text) for any status.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))  # gating, beside
from gating import WAIT_S, Call, hold, until

ARCHIVES = {  # file name -> model name, version, handler file (beside this module)
    "m.mar": ("m", "1.0", "gate_handler.py"),
    "m-v2.mar": ("m", "2.0", "gate_handler.py"),
    "m-v3.mar": ("m", "3.0", "gate_handler.py"),
}


def _versions(answer: tuple[int, Any]) -> Any:
    status, body = answer
    return [d["modelVersion"] for d in body] if status == 200 else body


def _background(call: Call, *args: Any) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call(*args)), daemon=True)
    thread.start()
    return thread, out


def run(call: Call, inference: str, management: str, gates: Path) -> dict[str, Any]:
    """Every step's answer by id: [status, body]."""
    answers: dict[str, Any] = {}
    reg = f"{management}/models?initial_workers=1&synchronous=true&url="
    answers["register_v1"] = call("POST", reg + "m.mar", None)
    answers["register_v2"] = call("POST", reg + "m-v2.mar", None)
    started, gate = gates / "started", gates / "gate"
    held, held_out = _background(
        call, "POST", f"{inference}/predictions/m/2.0", hold(started, gate)
    )
    answers["held_started"] = until(started.exists)
    leaving, leaving_out = _background(call, "DELETE", f"{management}/models/m/2.0", None)
    # The unregister has begun once its version is gone for describe (it drains meanwhile).
    v2 = f"{management}/models/m/2.0"
    answers["unregister_began"] = until(lambda: call("GET", v2, None)[0] == 404)
    answers["set_default_leaving"] = call("PUT", f"{v2}/set-default", None)
    answers["scale_leaving"] = call("PUT", f"{v2}?min_worker=2&synchronous=true", None)
    answers["unregister_leaving"] = call("DELETE", v2, None)
    answers["describe_all_leaving"] = _versions(call("GET", f"{management}/models/m/all", None))
    # Registered again while the unregister drains (TorchServe: at once; torchbay: once the
    # drain is over, so in the background here: the gate opens after it is sent).
    again, again_out = _background(call, "POST", reg + "m-v2.mar", None)
    gate.touch()
    for thread in (held, leaving, again):
        thread.join(WAIT_S)
    answers["held_request"] = held_out[0] if held_out else "no answer"
    answers["unregister_v2"] = leaving_out[0] if leaving_out else "no answer"
    answers["register_leaving"] = again_out[0] if again_out else "no answer"
    answers["versions_after"] = _versions(call("GET", f"{management}/models/m/all", None))
    answers["default_after"] = _versions(call("GET", f"{management}/models/m", None))
    v3 = f"{management}/models?initial_workers=1&synchronous=false&url=m-v3.mar"
    answers["register_v3_async"] = call("POST", v3, None)
    answers["unregister_v3_loading"] = call("DELETE", f"{management}/models/m/3.0", None)
    every = f"{management}/models/m/all"
    answers["v3_gone"] = until(lambda: _versions(call("GET", every, None)) == ["1.0", "2.0"])
    return {k: list(v) if isinstance(v, tuple) else v for k, v in answers.items()}
