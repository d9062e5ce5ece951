"""A bare grpcio asyncio server's round trip at concurrency 1: the floor under any gRPC server
written on grpc.aio (torchbay's and KServe's both are). The server echoes a 300-byte message, as
a unary and as a stream-unary handler (torchbay reads every method as a client stream), under
asyncio's own loop and under uvloop (torchbay's); the client is another process, grpcio's
synchronous stub, 3,000 sequential calls after 300 of warm-up.

    python results/grpc/echo_latency.py
"""

import asyncio
import statistics
import subprocess
import sys
import time

import grpc


def serve(kind: str, loop: str) -> None:
    """Serve ``/E/M`` echoing its message; print the port; run until killed."""
    ident = lambda b: b  # noqa: E731

    async def unary(message: bytes, context: object) -> bytes:
        return message

    async def stream_unary(messages: object, context: object) -> bytes:
        async for message in messages:  # type: ignore[attr-defined]
            return message
        return b""

    async def main() -> None:
        server = grpc.aio.server()
        if kind == "unary":
            handler = grpc.unary_unary_rpc_method_handler(unary, ident, ident)
        else:
            handler = grpc.stream_unary_rpc_method_handler(stream_unary, ident, ident)
        generic = grpc.method_handlers_generic_handler("E", {"M": handler})
        server.add_generic_rpc_handlers((generic,))
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        await server.start()
        await server.wait_for_termination()

    if loop == "uvloop":
        import uvloop

        uvloop.install()
    asyncio.run(main())


def p50_us(kind: str, loop: str, calls: int = 3000) -> float:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, loop], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        call = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/E/M")
        message = b"x" * 300
        for _ in range(300):
            call(message)
        latencies = []
        for _ in range(calls):
            start = time.perf_counter()
            call(message)
            latencies.append(time.perf_counter() - start)
        return 1e6 * statistics.median(latencies)
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], sys.argv[3])
    else:
        for handler in ("unary", "stream-unary"):
            for loop in ("asyncio", "uvloop"):
                print(f"{handler:12s} {loop:8s} p50 {p50_us(handler, loop):.0f} us", flush=True)
