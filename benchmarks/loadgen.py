"""The load generator: N spawned processes, each one asyncio loop with keep-alive connections
(or, for a gRPC target, unary calls over one channel per process).

Open loop (``rate``): requests are scheduled whatever the server does and timed from the
SCHEDULED time, so a stalled server cannot hide the queue it built (no coordinated omission).
Closed loop (``concurrency``): each connection sends again when its answer comes. A lagging
sender, the connection cap or a process near 100% CPU mark the run ``behind``: then the numbers
describe the generator, not the server (RESULTS.md, "Load generator capacity").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import multiprocessing
import re
import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from multiprocessing.connection import Connection
from typing import Any

from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.httpwire import Conn, HttpParseError
from torchbay.benchmarks.loadplan import (
    CONN_ERROR,
    TIMEOUT,
    LoadPlan,
    LoadResult,
    Part,
    Progress,
    Target,
    merge,
    split_plan,
)
from torchbay.benchmarks.stats import arrival_offsets

__all__ = ["LoadGenerator", "LoadPlan", "LoadResult", "Progress", "Target", "split_plan"]

START_MARGIN_S = 0.3  # time for the plan to reach every process before the common start
_PROGRESS_EVERY_S = 0.25


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) in :meth:`LoadGenerator.run`; ``args[0]``: the run until then."""


# -- inside a generator process -------------------------------------------------------------


_NO_CONNECTION = re.compile("failed to connect to all addresses|Socket closed|Connection reset")


class GrpcConn:
    """The process's one grpcio channel, shared by every caller (HTTP/2 multiplexes the calls):
    ``roundtrip`` answers 200 for OK, else the status code's name (``NOT_FOUND``...)."""

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
        except self.error as exc:  # a refused or lost connection: UNAVAILABLE in grpc core's words
            lost = exc.code().name == "UNAVAILABLE" and _NO_CONNECTION.search(exc.details() or "")
            return CONN_ERROR if lost else exc.code().name
        return 200

    def close(self) -> None:
        """Nothing per caller: the runner closes the channel once."""


class _Runner:
    """This process's share of a plan (:func:`split_plan`): connections that each send at their
    next send time (open loop: a scheduled time from the queue; closed loop: at once) and record
    every answer in ``part``."""

    def __init__(self, plan: LoadPlan, start_at: float) -> None:
        self.plan, self.start_at = plan, start_at
        self.window_start = start_at + plan.warmup_s
        self.end = math.inf if plan.duration_s is None else self.window_start + plan.duration_s
        self.requests = plan.target.requests()
        self.cycle = itertools.cycle(range(len(self.requests)))
        self.part = Part(self.window_start, plan.timeline)
        self.budget = math.inf if plan.requests is None else plan.requests
        self.grpc: GrpcConn | None = None  # the one channel of a gRPC target
        self.conns: list[Conn] = []  # closed when the run ends, a cancelled connection's too
        self.inflight = 0
        self.last_activity = start_at
        self.queue: deque[float] = deque()  # the open loop's scheduled times not yet sent
        self.idle: list[asyncio.Future] = []  # the open loop's connections waiting for one
        self.closed = plan.mode == "closed"
        self.dispatching = True  # the open loop may queue more

    def _take_budget(self, start: float) -> bool:
        """False once this process's request budget (counted after warm-up) is spent."""
        if start >= self.window_start:
            if self.budget <= 0:
                return False
            self.budget -= 1
        return True

    async def _send_times(self) -> AsyncIterator[float | None]:
        """One connection's send times: None (now, the closed loop) or a scheduled time."""
        while self.closed:
            now = time.monotonic()
            if now >= self.end or not self._take_budget(now):
                return
            yield None
        loop = asyncio.get_running_loop()
        while self.queue or self.dispatching:
            if self.queue:
                yield self.queue.popleft()
                continue
            waiter = loop.create_future()
            self.idle.append(waiter)
            await waiter

    async def _connection(self) -> None:
        """Send one request at a time on one connection, reconnecting after a failure."""
        conn: Conn | GrpcConn | None = None
        async for scheduled in self._send_times():
            sent = time.monotonic()
            self.part.count_sent(sent if scheduled is None else scheduled)
            index = next(self.cycle)
            self.inflight += 1
            self.last_activity = sent
            try:
                if conn is None or not conn.open:
                    conn = self.grpc or await self._connect(asyncio.get_running_loop())
                status = str(await conn.roundtrip(self.requests[index]))
            except (OSError, HttpParseError):
                status = CONN_ERROR
                if conn is not None:
                    conn.close()
                conn = None
            done = time.monotonic()
            self.inflight -= 1
            self.last_activity = done
            self.part.record(scheduled, sent, done, status, index)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> Conn:
        target = self.plan.target
        _, conn = await loop.create_connection(lambda: Conn(loop), target.host, target.port)
        self.conns.append(conn)
        return conn

    def _wake_one(self) -> bool:
        """Hand the queue to the most recently idle connection (LIFO keeps few sockets hot)."""
        if not self.idle:
            return False
        self.idle.pop().set_result(None)  # only a cancelled run leaves a waiter done
        return True

    async def _dispatch(self) -> None:
        """The open loop: queue each scheduled time when it comes, for an idle connection or a
        new one (up to ``max_connections``: past that the run is marked capped)."""
        plan = self.plan
        connections: list[asyncio.Task] = []
        offsets = arrival_offsets(
            plan.rate, arrival=plan.arrival, seed=plan.seed, phase=plan.phase, steps=plan.steps
        )
        for offset in offsets:
            scheduled = self.start_at + offset
            if scheduled >= self.end or not self._take_budget(scheduled):
                break
            delay = scheduled - time.monotonic()
            if delay > 0.0002:
                await asyncio.sleep(delay)
            self.queue.append(scheduled)
            if self._wake_one():
                continue
            if len(connections) < max(1, plan.max_connections):
                connections.append(asyncio.ensure_future(self._connection()))
            else:
                self.part.capped = True
        self.dispatching = False
        while self._wake_one():
            pass
        await asyncio.gather(*connections)

    async def run(self, pipe: Connection) -> Part:
        """Run the plan from the common start, telling the parent the answers so far (warm-up
        included) and those recorded every :data:`_PROGRESS_EVERY_S`."""
        if self.plan.target.grpc:  # before the start: not in the measured window
            self.grpc = GrpcConn(self.plan.target, self.plan.timeout_s)
        # Timers fire early at times: a request sent before the start escapes the window's budget.
        while (delay := self.start_at - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        cpu0, wall0 = time.process_time(), time.monotonic()
        if self.closed:
            task = asyncio.gather(*(self._connection() for _ in range(self.plan.concurrency)))
        else:
            task = asyncio.ensure_future(self._dispatch())
        timeout = self.plan.timeout_s
        # Requests still unanswered timeout_s after the window closed, or after nothing was sent
        # or answered for timeout_s, count as timeouts.
        while not task.done() and (now := time.monotonic()) <= self.end + timeout:
            if self.inflight and now - self.last_activity > timeout:
                break
            if pipe.poll():  # ("halt",) from the parent (Ctrl-C): no more sends, answers awaited
                pipe.recv()
                self.end, self.part.halted = min(self.end, now), True
            await asyncio.wait({task}, timeout=min(_PROGRESS_EVERY_S, timeout))
            pipe.send(("progress", self.part.completed, sum(self.part.statuses.values())))
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for scheduled in self.queue:  # offered in the window, never sent: unanswered too
                self.part.count_sent(scheduled)
            missing = self.part.sent - sum(self.part.statuses.values())
            if missing > 0:
                self.part.statuses[TIMEOUT] += missing
        for conn in self.conns:
            conn.close()
        if self.grpc is not None:
            await self.grpc.channel.close()
        self.part.cpu_s, self.part.wall_s = time.process_time() - cpu0, time.monotonic() - wall0
        return self.part


def _process_main(pipe: Connection) -> None:
    """A generator process: run plans from the pipe until told to stop."""
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - no uvloop on Windows
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent halts the run
    pipe.send(("ready",))
    with contextlib.suppress(EOFError):  # the parent is gone
        for kind, *args in iter(pipe.recv, ("stop",)):
            if kind != "run":
                continue  # a halt that came after the run ended
            runner = _Runner(*args)
            try:
                pipe.send(("done", loop.run_until_complete(runner.run(pipe))))
            except Exception as exc:  # report any crash to the parent as data, then go on
                pipe.send(("error", f"{type(exc).__name__}: {exc}"))


# -- the parent side ------------------------------------------------------------------------


class LoadGenerator:
    """A pool of generator processes that runs :class:`LoadPlan`s one after another."""

    def __init__(self, processes: int = 1) -> None:
        if processes < 1:
            raise BenchError("need at least one generator process")
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        for i in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_process_main, args=(child,), name=f"torchbay-loadgen-{i}", daemon=True
            )
            proc.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(proc)
        # A process still starting when a plan's common start passes would miss its window.
        for pipe in self.pipes:
            try:
                ready = pipe.poll(60) and pipe.recv() == ("ready",)
            except (EOFError, OSError):
                ready = False
            if not ready:
                self.close()
                raise BenchError("a load generator process did not start")

    def __enter__(self) -> LoadGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for pipe in self.pipes:
            pipe.close()
        self.pipes, self.procs = [], []

    def run(
        self, plan: LoadPlan, on_progress: Callable[[Progress], None] | None = None
    ) -> LoadResult:
        """Run ``plan`` on every process from a common start; raises BenchError if a process
        failed. ``on_progress`` is called about every 0.25 s from this thread."""
        plan.check()
        start_at = time.monotonic() + START_MARGIN_S
        waiting: list[Connection] = []
        for pipe, share in zip(self.pipes, split_plan(plan, len(self.pipes)), strict=True):
            if share.concurrency or share.rate:  # fewer connections than processes: some idle
                pipe.send(("run", share, start_at))
                waiting.append(pipe)
        parts: list[Part] = []
        failures: list[str] = []
        progress: dict[Connection, tuple[int, int]] = {}
        halted = False
        while waiting:
            try:  # Ctrl-C: the first one halts the run (its part is reported), a second one quits
                for pipe in multiprocessing.connection.wait(waiting, timeout=1.0):
                    try:
                        kind, *payload = pipe.recv()  # type: ignore[union-attr]
                    except (EOFError, OSError):
                        kind, payload = "error", ["a generator process died"]
                    if kind == "progress":
                        progress[pipe] = payload[0], payload[1]  # type: ignore[index]
                        if on_progress is not None:
                            completed, recorded = map(sum, zip(*progress.values(), strict=True))
                            on_progress(Progress(time.monotonic() - start_at, completed, recorded))
                        continue
                    waiting.remove(pipe)  # type: ignore[arg-type]
                    (failures if kind == "error" else parts).append(payload[0])
            except KeyboardInterrupt:
                if halted:
                    raise
                halted = True
                for pipe in waiting:
                    with contextlib.suppress(OSError):  # a process that died: its error follows
                        pipe.send(("halt",))
        if failures:
            raise BenchError("load generator failed: " + "; ".join(failures))
        if halted:
            raise Interrupted(merge(plan, parts))
        return merge(plan, parts)
