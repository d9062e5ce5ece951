"""Record how TorchServe 0.12 restarts a worker that dies again and again, each time after it
loaded (answers.json): ``crash.mar`` (``crash_handler.py``: its worker exits on a request whose
body is ``crash``; ``model-config.yaml``: one worker, ``maxRetryTimeoutInSec: 3``) is sent a
crash, served again, and crashed again past the 3 s window of the first crash, four times.

Run from the repository root, TorchServe in its own virtualenv (tests/data/torchserve_0.12/
README.md says how it was installed; Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \\
        tests/data/torchserve/worker_restarts/record.py

Each crash records the crash's answer, whether a request was answered 200 within 60 s of it
(``recovered``), the seconds from the first crash, and the model's worker states after.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

PORTS = {"inference": 18580, "management": 18581, "metrics": 18582}
WINDOW_S = 3  # model-config.yaml's maxRetryTimeoutInSec
CRASHES = 4


def served(base: str) -> bool:
    return tsrun.call(base + "/predictions/crash", "POST", b"hello")[0] == 200


def recovered(base: str, within_s: float = 60.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if served(base):
            return True
        time.sleep(0.2)
    return False


def crashes(base: str, management: str) -> list[dict]:
    out = []
    first = last = None
    for _ in range(CRASHES):
        # Each crash past the window of the one before (so past the first one's too).
        while last is not None and time.monotonic() - last <= WINDOW_S + 1:
            time.sleep(0.2)
        status, _, body = tsrun.call(base + "/predictions/crash", "POST", b"crash")
        last = time.monotonic()
        first = first or last
        since = last - first
        ok = recovered(base)
        described = json.loads(tsrun.call(management + "/models/crash", "GET")[2])[0]
        out.append(
            {
                "status": status,
                "answer": json.loads(body),
                "seconds_since_first": round(since),
                "recovered": ok,
                "workers": [w["status"] for w in described["workers"]],
            }
        )
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        config_file = ("--config-file", str(HERE / "model-config.yaml"))
        tsrun.archive("crash", HERE / "crash_handler.py", store, *config_file)
        config = {f"{k}_address": f"http://127.0.0.1:{port}" for k, port in PORTS.items()}
        config["disable_system_metrics"] = "true"
        properties = tsrun.properties(work / "config.properties", config)
        argv = tsrun.command(store, properties, "--models", "crash=crash.mar")
        base = f"http://127.0.0.1:{PORTS['inference']}"
        management = f"http://127.0.0.1:{PORTS['management']}"
        with tsrun.running(argv, work, lambda: served(base), ports=list(PORTS.values())):
            record = crashes(base, management)
    answers = {
        "command": tsrun.recorder_command(__file__),
        "torchserve": tsrun.torchserve_version(),
        "max_retry_timeout_s": WINDOW_S,
        "crashes": record,
    }
    tsrun.write_json(HERE / "answers.json", answers)


if __name__ == "__main__":
    main()
