"""Frontend time for a 16 MiB POST: the median client latency of the last 20 of N POSTs of 16 MiB
(random bytes) to /predictions/tiny, and the minimum, on a server started here. The tiny handler
refuses the body with a 500 once the frontend and the worker have it all.

    python results/ab/big-body-upload.py N

Needs /tmp/ab/tiny.mar (RESULTS.md, "The third robustness hunt's hot-path changes")."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

MODELS = (
    'models={"tiny": {"1.0": {"defaultVersion": true, "marName": "tiny.mar", '
    '"minWorkers": 1, "maxWorkers": 1}}}\n'
)


def serve(run: Path) -> tuple[subprocess.Popen, int]:
    config = run / "config.properties"
    config.write_text(MODELS + "disable_token_authorization=true\nmax_request_size=33554432\n")
    ready = run / "ready.json"
    env = {**os.environ, "TORCHBAY_GRPC_INFERENCE_PORT": "0", "TORCHBAY_GRPC_MANAGEMENT_PORT": "0"}
    args = [sys.executable, "-m", "torchbay", "serve", "--model-store", "/tmp/ab"]
    args += ["--foreground", "--ncs", "--ts-config", str(config), "--ready-file", str(ready)]
    args += ["--no-access-log"]
    for name in ("inference", "management", "metrics"):
        args += [f"--{name}-address", "http://127.0.0.1:0"]
    out = subprocess.DEVNULL
    proc = subprocess.Popen(args, cwd=run, env=env, stdout=out, stderr=out)
    while not ready.exists():
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())["inference"]


def main(count: int) -> None:
    proc, port = serve(Path(tempfile.mkdtemp()))
    body = os.urandom(16 << 20)
    headers = {"content-type": "application/octet-stream"}
    times = []
    try:
        with httpx.Client(timeout=60) as client:
            for _ in range(count):
                start = time.perf_counter()
                reply = client.post(
                    f"http://127.0.0.1:{port}/predictions/tiny", content=body, headers=headers
                )
                times.append(time.perf_counter() - start)
    finally:
        proc.terminate()
        proc.wait(30)
    median, least = statistics.median(times[3:]) * 1000, min(times) * 1000
    print(f"status {reply.status_code} median {median:.1f} ms min {least:.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]))
