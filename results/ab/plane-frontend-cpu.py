"""Frontend CPU per request, old main vs this main: start `torchbay serve` (tiny, batch 8, 1
worker, token auth off, gRPC on free ports), drive it with `torchbay bench run --url` (c=16, 8 s),
and read the frontend process's own CPU time (children excluded) over the run.
    python results/ab/plane-frontend-cpu.py PAIRS"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

SIDES = {"old": "/work/wt-old/.venv/bin", "new": "/work/main/.venv/bin"}


def served(port: int) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    ok = [x for x in text.splitlines() if x.startswith("torchbay_requests_total{")]
    return sum(float(x.split()[-1]) for x in ok if 'code="200"' in x)


LOCAL = "http://127.0.0.1:0"


def start(side: str) -> tuple[subprocess.Popen, dict]:
    """``torchbay serve`` of ``side`` on free ports; (process, the ready file's ports)."""
    run = Path(tempfile.mkdtemp(prefix=f"cpu-{side}-"))
    (run / "config.properties").write_text(
        'models={"tiny": {"1.0": {"defaultVersion": true, "marName": "tiny.mar", "minWorkers": 1, '
        '"maxWorkers": 1, "batchSize": 8, "maxBatchDelay": 5}}}\n'
        "disable_token_authorization=true\n"
    )
    env = {**os.environ, "TORCHBAY_GRPC_INFERENCE_PORT": "0", "TORCHBAY_GRPC_MANAGEMENT_PORT": "0"}
    ready = run / "ready.json"
    serve = [
        f"{SIDES[side]}/torchbay",
        "serve",
        "--model-store",
        "/tmp/ab",
        "--foreground",
        "--ts-config",
        str(run / "config.properties"),
        "--inference-address",
        LOCAL,
        "--management-address",
        LOCAL,
        "--metrics-address",
        LOCAL,
        "--ready-file",
        str(ready),
    ]
    proc = subprocess.Popen(
        serve, cwd=run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(600):
        if ready.exists():
            break
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())


def one(side: str) -> tuple[float, float, float]:
    """(frontend CPU seconds, ok req/s, requests the server counted) of one run."""
    proc, ports = start(side)
    try:
        front = psutil.Process(proc.pid)
        bench = [
            f"{SIDES[side]}/torchbay",
            "bench",
            "run",
            "--url",
            f"http://127.0.0.1:{ports['inference']}",
            "--model",
            "tiny",
            "--input",
            "/tmp/ab/tiny.bin",
            "-c",
            "16",
            "--duration",
            "8",
            "--warmup",
            "2",
            "--json",
        ]
        r0, c0 = served(ports["metrics"]), front.cpu_times()
        out = subprocess.run(bench, capture_output=True, text=True, check=True)
        c1, r1 = front.cpu_times(), served(ports["metrics"])
        done = json.loads(out.stdout)["client"]
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        return cpu, done["ok_per_s"], r1 - r0
    finally:
        proc.terminate()
        proc.wait(30)


for i in range(int(sys.argv[1])):
    for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
        cpu, rate, n = one(side)
        print(
            side,
            i,
            f"frontend {cpu / n * 1e6:.1f} us/request  rate {rate:.0f}/s  served {n:.0f}",
            flush=True,
        )
