"""Response cache hits against misses (issue 29): latency and the server's CPU per request, at
concurrency 1 and 8, on one server.

    .venv/bin/python results/cache/latency.py --rounds 3 --requests 200 > results/cache/latency.txt

One ``torchbay serve`` (1 worker, batch size 1, its default threads) serves ``mlp`` (TorchScript
``Linear(256, 256) -> ReLU -> Linear(256, 256)`` on ``[1, 256]`` FP32, the tensor handler),
archived by our archiver with ``responseCache: {enable: true, maxEntries: 100000}``. The client
is httpx posting OIP JSON to ``/v2/models/mlp/infer``, one keep-alive connection per client
thread, in three modes:

* ``hit``: the same request every time (stored once before the timing): answered by the frontend;
* ``miss``: a new input every time: looked up, run by the worker, stored;
* ``no-store``: the same request with ``Cache-Control: no-store``: the cache is skipped, the worker
  runs it (the server as it is without the cache).

Rounds alternate the modes' order. Latency: the median and p90 of every request of a mode at c=1;
at c=8, requests per second. CPU per request: the user+system CPU time of the server process and
its workers (psutil, the whole process tree) over a mode's requests, divided by their number.
Every mode's answers are checked once per round against the model run here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

from torchbay.benchmarks.managed import Endpoints, ManagedServer

# results/tensor_model.py: what the latency scripts share (results/ is no package).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_model

WIDTH = 256
MODES = ("hit", "miss", "no-store")


def build_archive(store: Path, work: Path) -> object:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH)
    ).eval()
    torch.jit.save(torch.jit.script(model), str(work / "mlp.pt"))
    torch.save(torch.randn(1, WIDTH), work / "example.pt")
    (work / "model-config.yaml").write_text(
        "responseCache: {enable: true, maxEntries: 100000}\n"
        f"inputs:\n  - {{name: x, datatype: FP32, shape: [-1, {WIDTH}]}}\n"
    )
    tensor_model.archive(store, work, "mlp")
    return model


def serving(store: Path, work: Path) -> ManagedServer:
    """``torchbay serve`` of mlp.mar on free ports, without the access log."""
    (work / "config.properties").write_text("access_log=false\n")
    args = ("--ts-config", str(work / "config.properties"))
    return ManagedServer.torchbay(store / "mlp.mar", work / "run", auth=False, extra_args=args)


def server_cpu_s(server: psutil.Process) -> float:
    """User + system CPU seconds of the server and every live worker under it."""
    total = 0.0
    for p in [server, *server.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def body(x: np.ndarray) -> bytes:
    tensor = {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


class Requests:
    """Each mode's next request body and headers; ``miss`` never repeats an input."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.same = self.rng.standard_normal((1, WIDTH), dtype=np.float32)
        self.lock = threading.Lock()

    def next(self, mode: str) -> tuple[bytes, dict[str, str]]:
        headers = {"content-type": "application/json"}
        if mode == "miss":
            with self.lock:
                x = self.rng.standard_normal((1, WIDTH), dtype=np.float32)
            return body(x), headers
        if mode == "no-store":
            headers["cache-control"] = "no-store"
        return body(self.same), headers


def check(client: httpx.Client, url: str, requests: Requests, model: object) -> None:
    import torch

    for mode in MODES:
        data, headers = requests.next(mode)
        x = np.array(json.loads(data)["inputs"][0]["data"], dtype=np.float32).reshape(1, WIDTH)
        got = client.post(url, content=data, headers=headers).json()["outputs"][0]["data"]
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy().ravel()  # type: ignore[operator]
        np.testing.assert_allclose(np.array(got, dtype=np.float32), want, rtol=1e-4, atol=1e-5)


def run(url: str, requests: Requests, mode: str, n: int, threads: int) -> list[float]:
    """``n`` requests of ``mode`` from ``threads`` clients; each request's latency in ms."""
    times: list[float] = []
    bodies = [requests.next(mode) for _ in range(n)]  # built before the clock starts

    def client(share: list[tuple[bytes, dict[str, str]]]) -> None:
        with httpx.Client(timeout=60) as c:
            for data, headers in share:
                start = time.perf_counter()
                response = c.post(url, content=data, headers=headers)
                times.append((time.perf_counter() - start) * 1000)
                assert response.status_code == 200, response.text

    workers = [threading.Thread(target=client, args=(bodies[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return times


def measure(
    ports: Endpoints, server: psutil.Process, model: object, args: argparse.Namespace
) -> dict:
    url = f"http://127.0.0.1:{ports.inference_port}/v2/models/mlp/infer"
    requests = Requests()
    results: dict = {}
    with httpx.Client(timeout=60) as warm:
        check(warm, url, requests, model)  # stores the "hit" request
    for threads in (1, 8):
        for r in range(args.rounds):
            order = MODES[r % 3 :] + MODES[: r % 3]
            for mode in order:
                cpu, wall = server_cpu_s(server), time.perf_counter()
                times = run(url, requests, mode, args.requests, threads)
                wall, cpu = time.perf_counter() - wall, server_cpu_s(server) - cpu
                slot = results.setdefault((threads, mode), {"ms": [], "cpu": 0.0, "s": 0.0})
                slot["ms"] += times
                slot["cpu"] += cpu
                slot["s"] += wall
            with httpx.Client(timeout=60) as c:
                check(c, url, requests, model)
    return results


def report(results: dict, args: argparse.Namespace) -> None:
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"mlp 256x256x2 FP32, OIP JSON over httpx, {args.rounds} rounds x {args.requests}")
    print(f"host: {os.cpu_count()} cores, load average {load} at the end; 1 worker, batch 1")
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    head = ("c", "mode", "median ms", "p90 ms", "req/s", "server CPU ms/req")
    print(f"{head[0]:>2} {head[1]:9} {head[2]:>10} {head[3]:>8} {head[4]:>8} {head[5]:>18}")
    for (threads, mode), slot in results.items():
        ms, n = slot["ms"], len(slot["ms"])
        p90 = statistics.quantiles(ms, n=10)[-1]
        cpu_ms = slot["cpu"] / n * 1000
        rate = n / slot["s"]
        print(
            f"{threads:>2} {mode:9} {statistics.median(ms):10.2f} {p90:8.2f} {rate:8.0f}"
            f" {cpu_ms:18.3f}"
        )


def main() -> None:
    args = tensor_model.rounds_and_requests(__doc__, rounds=3, requests=200)
    with tensor_model.scratch() as (store, work):
        model = build_archive(store, work)
        managed = serving(store, work)
        with managed as ports:
            results = measure(ports, psutil.Process(managed.pid), model, args)
    report(results, args)


if __name__ == "__main__":
    main()
