"""Record what TorchServe 0.12 answers and logs in each metrics case (sequence.CASES) into
answers.json: every step's status and normalised body, and the normalised lines of
``logs/ts_metrics.log`` and ``logs/model_metrics.log``.

Run from the repository root, TorchServe in its own virtualenv (tests/data/torchserve_0.12/
record.py says how it was installed; Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \\
        tests/data/torchserve/metrics_modes/record.py

It builds ``counted.mar`` with torch-model-archiver, then per case starts TorchServe in a fresh
folder on ports 18500-18504 (gRPC on 18503-18504; ``--foreground --ncs --disable-token-auth
--enable-model-api``, no system metrics), makes every call of sequence.STEPS in order, stops it
and reads its logs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this recorder's steps, tsrun
import sequence  # noqa: E402
import tsrun  # noqa: E402

COMMAND = tsrun.recorder_command(__file__)
PORTS = {sequence.INF: 18500, sequence.M: 18501, sequence.X: 18502}


def build_store(work: Path) -> Path:
    store = work / "store"
    store.mkdir()
    model = tsrun.scripted_linear(work)
    serialized = ("--serialized-file", str(model))
    tsrun.archive("counted", HERE / "metrics_handler.py", store, *serialized)
    return store


def body_of(step: dict, raw: bytes) -> object:
    text = raw.decode("utf-8", "replace")
    if step["listener"] == sequence.X:
        return sequence.metrics_text(text)
    try:
        return json.loads(text)
    except ValueError:
        return {"text": text}


def config_file(work: Path, lines: dict[str, str]) -> Path:
    """The case's config.properties: the fixed addresses, no system metrics, its own lines."""
    config = {f"{k}_address": f"http://127.0.0.1:{port}" for k, port in PORTS.items()}
    config.update(grpc_inference_port="18503", grpc_management_port="18504")
    config.update(disable_system_metrics="true", install_py_dep_per_model="false", **lines)
    if "metrics_config" in config:
        config["metrics_config"] = str(work / config["metrics_config"])
    return tsrun.properties(work / "config.properties", config)


def all_listening() -> bool:
    """Ready: every listener accepts a connection (no call: TorchServe would count it)."""
    return all(tsrun.listening(port) for port in PORTS.values())


def run_case(store: Path, name: str, lines: dict[str, str]) -> dict:
    while any(tsrun.listening(port) for port in PORTS.values()):  # another run's server
        time.sleep(0.5)
    work = Path(tempfile.mkdtemp(prefix=f"ts-metrics-{name}-"))
    shutil.copy(HERE / "custom_metrics.yaml", work)
    argv = tsrun.command(store, config_file(work, lines))
    env = {"LOG_LOCATION": str(work / "logs")}
    answers = []
    with tsrun.running(argv, work, all_listening, env=env, ports=tuple(PORTS.values())):
        for step in sequence.STEPS:
            url = f"http://127.0.0.1:{PORTS[step['listener']]}{step['path']}"
            status, _, raw = tsrun.call(url, step["method"], step.get("body"))
            print(name, step["id"], status, flush=True)
            answers.append({"id": step["id"], "status": status, "body": body_of(step, raw)})
    logs = {}
    for log in ("ts_metrics.log", "model_metrics.log"):
        path = work / "logs" / log
        logs[log] = sequence.log_lines(path.read_text()) if path.exists() else None
    return {"config": lines, "answers": answers, "logs": logs}


def main() -> None:
    store = build_store(Path(tempfile.mkdtemp(prefix="ts-metrics-store-")))
    cases = {name: run_case(store, name, lines) for name, lines in sequence.CASES.items()}
    tsrun.write_record(HERE, COMMAND, cases=cases)


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
