# python results/ab/hunt3-big-body.py N  (needs /tmp/ab/tiny.mar: see RESULTS.md, "third robustness hunt")
"""Frontend time for a 16 MiB POST: median client latency of N posts of 16 MiB to /predictions/tiny
(the tiny handler refuses the body after the frontend has read it all), on a server started here."""
import json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path
import httpx
run = Path(tempfile.mkdtemp())
(run / "config.properties").write_text(
    'models={"tiny": {"1.0": {"defaultVersion": true, "marName": "tiny.mar", "minWorkers": 1, "maxWorkers": 1}}}\n'
    "disable_token_authorization=true\nmax_request_size=33554432\n")
ready = run / "ready.json"
env = {**os.environ, "TORCHBAY_GRPC_INFERENCE_PORT": "0", "TORCHBAY_GRPC_MANAGEMENT_PORT": "0"}
args = [sys.executable, "-m", "torchbay", "serve", "--model-store", "/tmp/ab", "--foreground", "--ncs",
        "--ts-config", str(run / "config.properties"), "--ready-file", str(ready), "--no-access-log"]
for n in ("inference", "management", "metrics"):
    args += [f"--{n}-address", "http://127.0.0.1:0"]
proc = subprocess.Popen(args, cwd=run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while not ready.exists():
    time.sleep(0.1)
port = json.loads(ready.read_text())["inference"]
body = os.urandom(16 << 20)
times = []
with httpx.Client(timeout=60) as c:
    for i in range(int(sys.argv[1])):
        t = time.perf_counter()
        r = c.post(f"http://127.0.0.1:{port}/predictions/tiny", content=body, headers={"content-type": "application/octet-stream"})
        times.append(time.perf_counter() - t)
proc.terminate(); proc.wait(30)
print(f"status {r.status_code} median {statistics.median(times[3:])*1000:.1f} ms min {min(times)*1000:.1f} ms")
