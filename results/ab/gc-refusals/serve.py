"""Shared by ab.py and gc_count.py: start ``torchbay serve`` from a given checkout's Python with
one of three model setups, and the load each drives. Throw-away measuring code (README.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from torchbay.benchmarks.loadgen import LoadPlan
from torchbay.benchmarks.loadplan import Target

# Round two's archives and bodies (python -m torchbay.benchmarks.tables round2 --work WORK).
WORK = Path(os.environ.get("GC_AB_WORK", "/tmp/ab/work-new"))
_MODEL = '{"%s": {"1.0": {"defaultVersion": true, "marName": "%s.mar", %s}}}'
SETUPS = {  # mode: (model, its settings, extra config.properties lines)
    "refuse": ("tiny", '"minWorkers": 0, "maxWorkers": 0, "batchSize": 8, "maxBatchDelay": 5', ""),
    "tiny": ("tiny", '"minWorkers": 1, "maxWorkers": 1, "batchSize": 8, "maxBatchDelay": 5', ""),
    "over": (
        "cnn",
        '"minWorkers": 2, "maxWorkers": 2, "batchSize": 8, "maxBatchDelay": 10',
        "job_queue_size=100\nmax_queue_delay_ms=200\n",
    ),
}


def start(python: str, mode: str, run: Path, env: dict[str, str] | None = None) -> Any:
    """``torchbay serve`` (``python``'s checkout) for ``mode``; (process, ready.json, model)."""
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    model, settings, extra = SETUPS[mode]
    (run / "config.properties").write_text(f"models={_MODEL % (model, model, settings)}\n{extra}")
    local = "http://127.0.0.1:0"
    cmd = [python, "-m", "torchbay", "serve", "--ncs", "--model-store", str(WORK / "model_store")]
    cmd += ["--models", f"{model}={model}.mar", "--disable-token-auth"]
    cmd += ["--inference-address", local, "--management-address", local]
    cmd += ["--metrics-address", local, "--ts-config", str(run / "config.properties")]
    cmd += ["--ready-file", str(run / "ready.json")]
    grpc = {"TORCHBAY_GRPC_INFERENCE_PORT": "0", "TORCHBAY_GRPC_MANAGEMENT_PORT": "0"}
    log = (run / "server.log").open("w")
    env = {**os.environ, **grpc, **(env or {})}
    proc = subprocess.Popen(
        cmd, cwd=run, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            return proc, json.loads((run / "ready.json").read_text()), model
        except (OSError, ValueError):
            time.sleep(0.1)
    raise SystemExit(f"{python}: not ready in 180 s")


def plan(mode: str, port: int, model: str, seconds: float) -> LoadPlan:
    """``refuse``/``tiny``: closed loop c=16; ``over``: open loop at 780/s (4x the cnn's)."""
    body = (WORK / "models" / f"{model}.bin").read_bytes()
    raw = (("content-type", "application/octet-stream"),)
    target = Target("127.0.0.1", port, f"/predictions/{model}", (body,), raw)
    if mode == "over":
        return LoadPlan(target, "open", rate=780, duration_s=seconds, max_connections=256)
    return LoadPlan(target, "closed", concurrency=16, duration_s=seconds)


def cpu_s(pid: int) -> float:
    """The process's own user+system CPU seconds (children excluded)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc: Any) -> None:
    os.killpg(proc.pid, 15)
    proc.wait(30)
