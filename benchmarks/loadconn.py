"""Inside a load-generator process: one keep-alive connection (:class:`Conn`) or gRPC channel
(:class:`GrpcConn`), and the :class:`Recorder` of the process's measurements."""

from __future__ import annotations

import array
import asyncio
from collections import Counter

from torchbay.benchmarks.httpwire import HttpParseError, ResponseParser
from torchbay.benchmarks.loadplan import ARRAYS, CONN_ERROR, TIMEOUT, Part, Target


class Conn(asyncio.Protocol):
    """One keep-alive connection; ``roundtrip`` sends a request and awaits its status."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = ResponseParser()
        self.waiter: asyncio.Future | None = None
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        try:
            responses = self.parser.feed(data)
        except HttpParseError as exc:
            self._fail(exc)
            return
        for status, _size, keep_alive in responses:
            if not keep_alive:
                self.open = False
            waiter, self.waiter = self.waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        try:
            last = self.parser.feed_eof()
        except HttpParseError as err:
            self._fail(err)
            return
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            if last is not None:
                waiter.set_result(last[0])
            else:
                waiter.set_exception(ConnectionError("connection closed"))

    def _fail(self, exc: Exception) -> None:
        self.open = False
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    async def roundtrip(self, request: bytes) -> int:
        self.waiter = self.loop.create_future()
        assert self.transport is not None
        self.transport.write(request)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class GrpcConn:
    """One grpcio asyncio channel that every caller of a process shares (HTTP/2 multiplexes the
    calls); ``roundtrip`` makes one unary call with serialized bytes and returns 200 for OK, else
    the status code's name (``NOT_FOUND``, ``DEADLINE_EXCEEDED``...)."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        import grpc

        self.error = grpc.aio.AioRpcError
        unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        address = f"{target.host}:{target.port}"
        self.channel = grpc.aio.insecure_channel(address, options=unlimited)
        self.call = self.channel.unary_unary(target.grpc)  # bytes in, bytes out
        self.metadata = tuple((k.lower(), v) for k, v in target.headers) or None
        self.timeout_s = timeout_s
        self.open = True

    async def roundtrip(self, request: bytes) -> int | str:
        try:
            await self.call(request, metadata=self.metadata, timeout=self.timeout_s)
        except self.error as exc:
            return exc.code().name
        return 200

    def close(self) -> None:
        """Nothing to do per caller; the runner closes the channel once (:meth:`aclose`)."""

    async def aclose(self) -> None:
        await self.channel.close()


class Recorder:
    """Collects one process's measurements for requests started inside the window; with
    ``timeline``, every answer's (start, latency, status) and request index, warm-up included."""

    def __init__(self, window_start: float, timeline: bool = False) -> None:
        self.window_start = window_start
        self.latency = array.array("d")
        self.service = array.array("d")
        self.lag = array.array("d")
        self.statuses: Counter[str] = Counter()
        self.completed = 0
        self.sent = 0
        self.last_done = 0.0
        self.keep_timeline = timeline
        self.timeline, self.variants = array.array("d"), array.array("I")

    def record(
        self, scheduled: float | None, sent: float, done: float, status: str, index: int = 0
    ) -> None:
        self.completed += 1
        start = sent if scheduled is None else scheduled
        if self.keep_timeline:
            code = float(status) if status.isdigit() else -1.0
            self.timeline.extend((start - self.window_start, done - start, code))
            self.variants.append(index)
        if start < self.window_start:
            return  # warm-up
        self.statuses[status] += 1
        if status in (CONN_ERROR, TIMEOUT):
            return
        # Timed from the schedule, so a late send counts its wait (no coordinated omission); a
        # request that left early is timed from its actual send (never flatter than real).
        self.latency.append(done - min(start, sent))
        self.service.append(done - sent)
        if scheduled is not None:
            self.lag.append(max(0.0, sent - scheduled))
        self.last_done = max(self.last_done, done)

    def count_sent(self, start: float) -> None:
        if start >= self.window_start:
            self.sent += 1

    def part(self, cpu_s: float, wall_s: float, capped: bool) -> Part:
        """What this process sends back to the parent."""
        return Part(
            **{name: getattr(self, name).tobytes() for name in ARRAYS},
            statuses=dict(self.statuses),
            sent=self.sent,
            last_done=self.last_done,
            window_start=self.window_start,
            cpu_s=cpu_s,
            wall_s=wall_s,
            capped=capped,
        )
