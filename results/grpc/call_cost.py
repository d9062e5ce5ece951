"""Server CPU per call at concurrency 1: torchbay's gRPC ModelInfer beside its HTTP
``/predictions`` and ``/v2/models/tiny/infer`` (binary extension) on one server, and a bare
grpcio server (no servicer logic: the message echoed) as asyncio unary, asyncio stream-unary
(how torchbay reads every method) and synchronous (thread pool) handlers.

    python results/grpc/call_cost.py [--calls N] [--rounds R]

Needs /tmp/ab/model_store/tiny.mar and /tmp/ab/models/tiny.bin (benchmarks.runner's
prepare_models and archive_models with /tmp/ab). Each figure: the server process's CPU time
(threads included, children excluded) over N sequential calls after 300 of warm-up, per call;
medians of R rounds. The client is another process."""

import argparse
import asyncio
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import psutil

from torchbay.benchmarks.managed import ManagedServer

AB = Path("/tmp/ab")
ECHO = ("aio-unary", "aio-stream-unary", "sync-unary")


def echo_server(kind: str) -> None:
    """Serve ``/E/M`` echoing its message, print the port, run until killed."""
    ident = lambda b: b  # noqa: E731
    if kind == "sync-unary":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        handler = grpc.unary_unary_rpc_method_handler(lambda m, c: m, ident, ident)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("E", {"M": handler}),)
        )
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        server.start()
        server.wait_for_termination()
        return

    async def unary(message: bytes, context: object) -> bytes:
        return message

    async def stream_unary(messages: object, context: object) -> bytes:
        async for message in messages:
            return message
        return b""

    async def main() -> None:
        server = grpc.aio.server()
        make = grpc.unary_unary_rpc_method_handler, grpc.stream_unary_rpc_method_handler
        handler = (
            make[0](unary, ident, ident)
            if kind == "aio-unary"
            else make[1](stream_unary, ident, ident)
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("E", {"M": handler}),)
        )
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        await server.start()
        await server.wait_for_termination()

    import uvloop  # as torchbay's frontend runs

    uvloop.install()
    asyncio.run(main())


def model_infer_request() -> bytes:
    from torchbay.server.grpc.messages import message

    body = (AB / "models" / "tiny.bin").read_bytes()
    request = message("inference.ModelInferRequest")(model_name="tiny")
    request.inputs.add(name="data", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(struct.pack("<I", len(body)) + body)
    return request.SerializeToString()


class Http:
    """One keep-alive connection, a request's bytes prebuilt, the answer read to its end."""

    def __init__(self, port: int, path: str, body: bytes, headers: str = "") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
        self.raw = head.encode() + body

    def __call__(self) -> None:
        self.sock.sendall(self.raw)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head, rest = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200"), head
        length = next(
            int(v)
            for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
            if k.lower() == b"content-length"
        )
        while len(rest) < length:
            rest += self.sock.recv(65536)


def cpu_per_call(process: psutil.Process, call, calls: int) -> float:
    for _ in range(300):
        call()
    before = process.cpu_times()
    for _ in range(calls):
        call()
    after = process.cpu_times()
    return (after.user + after.system - before.user - before.system) / calls * 1e6


def torchbay_side(calls: int) -> dict[str, float]:
    server = ManagedServer.torchbay(
        AB / "model_store" / "tiny.mar",
        AB / "run-call-cost",
        auth=False,
        extra_args=("--no-access-log",),
    )
    with server as endpoints:
        channel = grpc.insecure_channel(f"127.0.0.1:{endpoints.grpc_port}")
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        raw = model_infer_request()
        body = (AB / "models" / "tiny.bin").read_bytes()
        params = {"binary_data_size": len(body) + 4}
        head = json.dumps(
            {"inputs": [{"name": "data", "datatype": "BYTES", "shape": [1], "parameters": params}]}
        )
        v2 = head.encode() + struct.pack("<I", len(body)) + body
        v2_headers = (
            f"Inference-Header-Content-Length: {len(head)}\r\n"
            "Content-Type: application/octet-stream\r\n"
        )
        port = endpoints.inference_port
        kinds = {
            "torchbay gRPC ModelInfer": lambda: infer(raw, timeout=10),
            "torchbay HTTP /predictions": Http(port, "/predictions/tiny", body),
            "torchbay HTTP v2 infer (binary)": Http(port, "/v2/models/tiny/infer", v2, v2_headers),
        }
        front = psutil.Process(server.pid)
        return {name: cpu_per_call(front, call, calls) for name, call in kinds.items()}


def echo_side(kind: str, calls: int) -> float:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--echo", kind], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(proc.stdout.readline())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        call = channel.unary_unary("/E/M")
        message = model_infer_request()
        return cpu_per_call(psutil.Process(proc.pid), lambda: call(message, timeout=10), calls)
    finally:
        proc.kill()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--echo", choices=ECHO, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo:
        return echo_server(args.echo)
    results: dict[str, list[float]] = {}
    for round_no in range(args.rounds):
        figures = torchbay_side(args.calls)
        figures |= {f"bare grpcio, {kind}": echo_side(kind, args.calls) for kind in ECHO}
        for name, value in figures.items():
            results.setdefault(name, []).append(value)
        print(
            f"round {round_no + 1}, load average {os.getloadavg()[0]:.1f}: "
            + ", ".join(f"{k} {v:.0f}" for k, v in figures.items()),
            flush=True,
        )
    print_table(results, "server, call", "server CPU µs per call")


def print_table(results: dict[str, list[float]], what: str, figure: str) -> None:
    """A markdown table: each row's figure in every round, and their median."""
    print(f"\n| {what} | {figure} (each round) | median |\n|---|---|---:|")
    for name, values in results.items():
        each = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {name} | {each} | {statistics.median(values):.0f} |")


if __name__ == "__main__":
    main()
