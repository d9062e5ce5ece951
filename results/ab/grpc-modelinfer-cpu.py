"""Frontend CPU per gRPC ModelInfer, old main vs this main: `torchbay serve` of each side (tiny
archive, raw BYTES input, defaults: batch 1, 1 worker, access log off, token auth off, gRPC on a
free port), 300 calls of warm-up, then N sequential calls (concurrency 1) from one grpcio
channel; the frontend process's own CPU time (children excluded) over the N calls.

    python results/ab/grpc-modelinfer-cpu.py N PAIRS

Needs /tmp/ab/model_store/tiny.mar and /tmp/ab/models/tiny.bin (benchmarks.runner's
prepare_models and archive_models with /tmp/ab) and old main's checkout, with its .venv, at
/work/wt-old."""

import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import grpc
import psutil

from torchbay.server.grpc.messages import message

SIDES = {"old": "/work/wt-old", "new": "/work/main"}
AB = Path("/tmp/ab")


def serve(root: str) -> tuple[subprocess.Popen, dict]:
    run = AB / f"run-{Path(root).name}"
    run.mkdir(exist_ok=True)
    ready = run / "ready.json"
    ready.unlink(missing_ok=True)
    env = {**os.environ, "TORCHBAY_GRPC_INFERENCE_PORT": "0", "TORCHBAY_GRPC_MANAGEMENT_PORT": "0"}
    cmd = [f"{root}/.venv/bin/python", "-m", "torchbay", "serve", "--foreground", "--ncs"]
    cmd += [
        "--no-access-log",
        "--model-store",
        str(AB / "model_store"),
        "--models",
        "tiny=tiny.mar",
    ]
    cmd += ["--disable-token-auth", "--ready-file", str(ready)]
    for api in ("inference", "management", "metrics"):
        cmd += [f"--{api}-address", "http://127.0.0.1:0"]
    proc = subprocess.Popen(
        cmd, cwd=run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    while not ready.exists():
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


def request() -> bytes:
    body = (AB / "models" / "tiny.bin").read_bytes()
    req = message("inference.ModelInferRequest")(model_name="tiny")
    req.inputs.add(name="data", datatype="BYTES", shape=[1])
    req.raw_input_contents.append(struct.pack("<I", len(body)) + body)
    return req.SerializeToString()


def measure(root: str, n: int) -> tuple[float, float]:
    """(frontend CPU us per call, latency us per call) of one side."""
    proc, info = serve(root)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{info['grpc_inference']}")
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        raw = request()
        for _ in range(300):
            call(raw, timeout=10)
        front = psutil.Process(info["pid"])
        c0, t0 = front.cpu_times(), time.perf_counter()
        for _ in range(n):
            call(raw, timeout=10)
        wall, c1 = time.perf_counter() - t0, front.cpu_times()
        channel.close()
        return (c1.user + c1.system - c0.user - c0.system) / n * 1e6, wall / n * 1e6
    finally:
        proc.terminate()
        proc.wait(30)


n, pairs = int(sys.argv[1]), int(sys.argv[2])
results: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
for i in range(pairs):
    for side in SIDES if i % 2 == 0 else reversed(SIDES):
        cpu, latency = measure(SIDES[side], n)
        results[side].append((cpu, latency))
        print(side, i, f"frontend CPU {cpu:.0f} us/call, latency {latency:.0f} us", flush=True)
for side, runs in results.items():
    cpu = statistics.median(c for c, _ in runs)
    latency = statistics.median(lat for _, lat in runs)
    print(side, f"median frontend CPU {cpu:.0f} us/call; median latency {latency:.0f} us")
