"""A ``torchbay serve`` start with N start-up models, old code against new, alternating.

    python results/startup/many_models.py OLD_PYTHON NEW_PYTHON --mar tiny.mar --models 1 4 8 \
        --runs 3 > results/startup/many-models.txt

Each start: ``python -m torchbay serve --foreground`` over a store with N copies of ``--mar``
(one worker each: ``default_workers_per_model=1``), every port 0, until its ``--ready-file``
(written once every start-up model is loaded). Reported per start: seconds to ready, and the CPU
seconds (user + system) of the server's whole process tree, at ready and again 5 s later (the
old code started its worker template after the start-up models: its import ran after ready).
Medians over ``--runs``; old and new alternate start by start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

SETTLE_S = 5.0


def _tree_cpu(root: psutil.Process) -> float:
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def _start(python: str, mar: Path, n: int, work: Path) -> dict[str, float]:
    store = work / "store"
    shutil.rmtree(work, ignore_errors=True)
    store.mkdir(parents=True)
    models = []
    for i in range(n):
        shutil.copy(mar, store / f"m{i}.mar")
        models.append(f"m{i}=m{i}.mar")
    props = work / "config.properties"
    props.write_text("grpc_inference_port=0\ngrpc_management_port=0\ndefault_workers_per_model=1\n")
    ready = work / "ready.json"
    args = [python, "-m", "torchbay", "serve", "--foreground", "--ncs", "--disable-token-auth"]
    args += ["--model-store", str(store), "--ts-config", str(props), "--ready-file", str(ready)]
    for name in ("inference", "management", "metrics"):
        args += [f"--{name}-address", "http://127.0.0.1:0"]
    args += ["--models", *models]
    env = {**os.environ, "LOG_LOCATION": str(work / "logs"), "TMPDIR": str(work)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        args, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        while not ready.exists():
            if proc.poll() is not None or time.perf_counter() - t0 > 300:
                raise RuntimeError(f"no ready file ({proc.returncode})")
            time.sleep(0.01)
        ready_s = time.perf_counter() - t0
        root = psutil.Process(proc.pid)
        cpu_ready = _tree_cpu(root)
        failed = json.loads(ready.read_text())["failed_models"]
        time.sleep(SETTLE_S)
        cpu_settled = _tree_cpu(root)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert not failed, failed
    return {"ready_s": ready_s, "cpu_at_ready_s": cpu_ready, "cpu_5s_later_s": cpu_settled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--mar", type=Path, required=True)
    parser.add_argument("--models", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="many-models-"))
    print(f"old: {args.old}\nnew: {args.new}\nmar: {args.mar}; load average {os.getloadavg()}")
    for n in args.models:
        runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
        for _ in range(args.runs):
            for side in ("old", "new"):
                runs[side].append(_start(getattr(args, side), args.mar, n, work / side))
        for side, results in runs.items():
            cells = []
            for key in ("ready_s", "cpu_at_ready_s", "cpu_5s_later_s"):
                values = [r[key] for r in results]
                every = ", ".join(f"{v:.2f}" for v in values)
                cells.append(f"{key} {statistics.median(values):.2f} ({every})")
            print(f"N={n} {side}: " + "; ".join(cells), flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
