"""Each protocol's floor beside its inference, on one torchbay server at concurrency 1: what an
inference adds above the cheapest call of the same protocol. HTTP: ``GET /v2/health/live`` and
``POST /v2/models/tiny/infer`` (binary extension) on one keep-alive connection (raw bytes);
gRPC: ``ServerLive`` and ``ModelInfer`` (grpcio's synchronous stub). ``tiny``, a raw BYTES input,
batch 1, 1 worker, no access log; 3,000 sequential calls after 300 of warm-up, p50 per round.

    python results/grpc/floors.py [--rounds 3]

Builds /tmp/ab (benchmarks.runner's reference models and archives) when it is missing."""

import argparse
import json
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from call_cost import model_infer_request, print_table  # beside this script

from torchbay.benchmarks import runner
from torchbay.benchmarks.managed import ManagedServer
from torchbay.server.grpc.messages import message

AB = Path("/tmp/ab")


def p50_us(call: Callable[[], object], calls: int = 3000) -> float:
    for _ in range(300):
        call()
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - start)
    return 1e6 * statistics.median(latencies)


def http_call(sock: socket.socket, raw: bytes) -> Callable[[], None]:
    def call() -> None:
        sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, rest = data.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        size = int(next(h.split(b":")[1] for h in lines if h.lower().startswith(b"content-length")))
        while len(rest) < size:
            rest += sock.recv(65536)

    return call


def calls(endpoints, body: bytes) -> dict[str, Callable[[], object]]:
    params = {"binary_data_size": len(body) + 4}
    tensor = {"name": "data", "datatype": "BYTES", "shape": [1], "parameters": params}
    head = json.dumps({"inputs": [tensor]})
    payload = head.encode() + struct.pack("<I", len(body)) + body
    infer = (
        f"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + payload
    sock = socket.create_connection(("127.0.0.1", endpoints.inference_port))
    channel = grpc.insecure_channel(f"127.0.0.1:{endpoints.grpc_port}")
    service = "/inference.GRPCInferenceService/"
    live, model_infer = (channel.unary_unary(service + m) for m in ("ServerLive", "ModelInfer"))
    live_raw = message("inference.ServerLiveRequest")().SerializeToString()
    infer_raw = model_infer_request()  # the same ModelInfer call_cost.py measures
    return {
        "HTTP GET /v2/health/live": http_call(
            sock, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        ),
        "HTTP POST /v2/models/tiny/infer": http_call(sock, infer),
        "gRPC ServerLive": lambda: live(live_raw, timeout=10),
        "gRPC ModelInfer": lambda: model_infer(infer_raw, timeout=10),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not (AB / "model_store" / "tiny.mar").exists():
        runner.archive_models(runner.prepare_models(AB), AB, sys.executable)
    body = (AB / "models" / "tiny.bin").read_bytes()
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        archive = AB / "model_store" / "tiny.mar"
        server = ManagedServer.torchbay(
            archive, AB / "run-floors", auth=False, extra_args=("--no-access-log",)
        )
        with server as endpoints:
            for name, call in calls(endpoints, body).items():
                results.setdefault(name, []).append(p50_us(call))
        print(", ".join(f"{k} {v[-1]:.0f}" for k, v in results.items()), flush=True)
    print_table(results, "call", "p50 µs")


if __name__ == "__main__":
    main()
