"""Record what TorchServe 0.12's health check (``/ping``) answers while a model's workers are
still loading (answers.json): ``slow.mar`` (``slow_handler.py``: its initialization takes 15 s)
registered with one worker without waiting (``synchronous=false``), ``/ping`` asked at once and
once the worker is READY; then scaled to two workers without waiting, ``/ping`` asked at once and
once both are READY. The server starts with no model.

Run from the repository root, TorchServe in its own virtualenv (Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \\
        tests/data/torchserve/ping_loading/record.py
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

PORTS = {"inference": 18596, "management": 18597, "metrics": 18598}


def ping(base: str) -> list:
    status, _, body = tsrun.call(base + "/ping", "GET")
    return [status, json.loads(body)]


def statuses(management: str) -> list[str]:
    described = json.loads(tsrun.call(management + "/models/slow", "GET")[2])
    return [w["status"] for w in described[0]["workers"]]


def until_ready(management: str, count: int) -> list[str]:
    deadline = time.monotonic() + 120
    while statuses(management) != ["READY"] * count:
        if time.monotonic() > deadline:
            raise SystemExit("the workers did not load")
        time.sleep(0.5)
    return statuses(management)


def steps(base: str, management: str) -> list[dict]:
    out = []
    url = management + "/models?url=slow.mar&initial_workers=1&synchronous=false"
    status, _, body = tsrun.call(url, "POST")
    out.append({"step": "register, 1 worker", "answer": [status, json.loads(body)]})
    out.append({"step": "at once", "ping": ping(base), "workers": statuses(management)})
    workers = until_ready(management, 1)
    out.append({"step": "loaded", "ping": ping(base), "workers": workers})
    status, _, body = tsrun.call(management + "/models/slow?min_worker=2", "PUT")
    out.append({"step": "scale to 2", "answer": [status, json.loads(body)]})
    out.append({"step": "at once", "ping": ping(base), "workers": statuses(management)})
    workers = until_ready(management, 2)
    out.append({"step": "loaded", "ping": ping(base), "workers": workers})
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        tsrun.archive("slow", HERE / "slow_handler.py", store)
        config = {f"{k}_address": f"http://127.0.0.1:{port}" for k, port in PORTS.items()}
        config["disable_system_metrics"] = "true"
        properties = tsrun.properties(work / "config.properties", config)
        argv = tsrun.command(store, properties)
        base = f"http://127.0.0.1:{PORTS['inference']}"
        management = f"http://127.0.0.1:{PORTS['management']}"
        with tsrun.running(argv, work, tsrun.pinged(base), ports=list(PORTS.values())):
            record = steps(base, management)
    tsrun.write_record(HERE, tsrun.recorder_command(__file__), steps=record)


if __name__ == "__main__":
    main()
