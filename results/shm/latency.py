"""Latency of one 16 MiB FP32 input and its 16 MiB FP32 output, at concurrency 1, through
system shared memory against binary HTTP and gRPC, side by side on one server (issue 28).

    .venv/bin/python results/shm/latency.py --rounds 5 --requests 20 > results/shm/latency.txt

One ``torchbay serve`` (1 worker, batch size 1, its default threads) serves ``plus1`` (TorchScript
``x + 1`` on ``[1, 4194304]`` FP32), archived by our archiver. The client is tritonclient 2.73,
the way Triton's own examples use it, in four modes:

* ``http``: binary tensor data over HTTP (``InferInput.set_data_from_numpy``, binary output);
* ``grpc``: ``raw_input_contents`` / ``raw_output_contents``;
* ``http+shm`` and ``grpc+shm``: the input and output in two registered system shared-memory
  regions; each request's time INCLUDES the client copying its input into the region and its
  output out of it (``np.copyto`` both ways), so the comparison is against a client that had the
  data in its own memory, not one that produced it in the region.

Rounds alternate the four modes' order; each mode's figure is the median (and p90) of all its
requests. Every answer is checked (``x + 1``) once per mode and round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from torchbay.benchmarks.managed import Endpoints, ManagedServer

# results/tensor_model.py: what the latency scripts share (results/ is no package).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_model

N = 4 * 1024 * 1024  # FP32 elements: 16 MiB
NBYTES = N * 4


def build_archive(store: Path, work: Path) -> None:
    import torch

    class Plus1(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    torch.jit.save(torch.jit.script(Plus1()), str(work / "plus1.pt"))
    torch.save(torch.randn(1, N), work / "example.pt")  # zeros would look like a zip bomb
    (work / "model-config.yaml").write_text(
        f"inputs:\n  - {{name: INPUT0, datatype: FP32, shape: [-1, {N}]}}\n"
        f"outputs:\n  - {{name: OUTPUT0, datatype: FP32, shape: [-1, {N}]}}\n"
    )
    tensor_model.archive(store, work, "plus1")


def serving(store: Path, work: Path) -> ManagedServer:
    """``torchbay serve`` of plus1.mar on free ports, 64 MiB request and response limits (the
    binary modes carry 16 MiB each way), shared memory allowed."""
    config = work / "config.properties"
    limit = 64 << 20
    config.write_text(f"max_request_size={limit}\nmax_response_size={limit}\naccess_log=false\n")
    args = ("--ts-config", str(config), "--allow-client-shm")
    return ManagedServer.torchbay(store / "plus1.mar", work / "run", auth=False, extra_args=args)


def modes(ports: Endpoints) -> tuple[dict[str, Callable[[np.ndarray], np.ndarray]], dict]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    http = httpclient.InferenceServerClient(
        f"127.0.0.1:{ports.inference_port}", connection_timeout=120, network_timeout=120
    )
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc_port}")
    http.unregister_system_shared_memory()
    suffix = uuid.uuid4().hex[:8]
    regions = {}
    for name in ("in", "out"):
        key = f"/tb-bench-{name}-{suffix}"
        regions[name] = shm.create_shared_memory_region(name, key, NBYTES)
        http.register_system_shared_memory(name, key, NBYTES)
    in_view = shm.get_contents_as_numpy(regions["in"], np.float32, [1, N])
    out_view = shm.get_contents_as_numpy(regions["out"], np.float32, [1, N])

    def binary(module, client) -> Callable[[np.ndarray], np.ndarray]:
        def run(x: np.ndarray) -> np.ndarray:
            inp = module.InferInput("INPUT0", [1, N], "FP32")
            inp.set_data_from_numpy(x)
            out = module.InferRequestedOutput("OUTPUT0")
            return client.infer("plus1", [inp], outputs=[out]).as_numpy("OUTPUT0")

        return run

    def shared(module, client) -> Callable[[np.ndarray], np.ndarray]:
        def run(x: np.ndarray) -> np.ndarray:
            np.copyto(in_view, x)
            inp = module.InferInput("INPUT0", [1, N], "FP32")
            inp.set_shared_memory("in", NBYTES)
            out = module.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("out", NBYTES)
            client.infer("plus1", [inp], outputs=[out])
            return np.array(out_view)

        return run

    return {
        "http": binary(httpclient, http),
        "grpc": binary(grpcclient, grpc),
        "http+shm": shared(httpclient, http),
        "grpc+shm": shared(grpcclient, grpc),
    }, regions


def measure(runs: dict, rounds: int, requests: int) -> dict[str, list[float]]:
    x = np.random.default_rng(0).standard_normal((1, N), dtype=np.float32)
    names = list(runs)
    for run in runs.values():  # warm every path once
        np.testing.assert_allclose(run(x), x + 1)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            np.testing.assert_allclose(runs[name](x), x + 1)
            for _ in range(requests):
                start = time.perf_counter()
                runs[name](x)
                times[name].append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    args = tensor_model.rounds_and_requests(__doc__, rounds=5, requests=20)
    import tritonclient.utils.shared_memory as shm

    with tensor_model.scratch() as (store, work):
        build_archive(store, work)
        with serving(store, work) as ports:
            runs, regions = modes(ports)
            try:
                times = measure(runs, args.rounds, args.requests)
            finally:
                for handle in regions.values():
                    shm.destroy_shared_memory_region(handle)
    report(times, args)


def report(times: dict[str, list[float]], args: argparse.Namespace) -> None:
    print(f"16 MiB FP32 in and out, c=1, {args.rounds} rounds x {args.requests} requests a mode")
    print(f"host: {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'mode':10} {'median ms':>10} {'p90 ms':>8}")
    med = {}
    for name, values in times.items():
        med[name] = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"{name:10} {med[name]:10.1f} {p90:8.1f}")
    for proto in ("http", "grpc"):
        print(f"{proto}: binary / shm = {med[proto] / med[proto + '+shm']:.1f}x")


if __name__ == "__main__":
    main()
