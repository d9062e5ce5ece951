"""A load test's plan, its split over generator processes, each process's :class:`Part` and
their :func:`merge` into one :class:`LoadResult`. No I/O: ``loadgen.py`` runs the plans."""

from __future__ import annotations

import array
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.httpwire import build_request
from torchbay.benchmarks.stats import Arrival, LatencySummary, error_rate, rate, summarize

Mode = Literal["closed", "open"]
LAG_WARN_MS = 5.0
CPU_WARN_PCT = 90.0
CONN_ERROR = "conn-error"
TIMEOUT = "timeout"
# The measurement arrays of a :class:`Part`, which the parent concatenates.
ARRAYS = ("latency", "service", "lag", "timeline", "variants")


@dataclass(frozen=True)
class Target:
    """Where to send: one route, headers, and payloads (cycled in order). With ``grpc`` (a
    method's path, ``/package.Service/Method``) the payloads are serialized request messages and
    the headers call metadata. ``paths``, when given, are request variants sent instead of
    ``path`` (a model mix drawn once); :attr:`LoadResult.variants` names each answer's."""

    host: str
    port: int
    path: str
    payloads: tuple[bytes, ...]
    headers: tuple[tuple[str, str], ...] = ()
    method: str = "POST"
    grpc: str = ""
    paths: tuple[str, ...] = ()

    def requests(self) -> list[bytes]:
        """One request's wire bytes per ``paths`` entry (payloads cycled), else per payload."""
        if self.grpc:
            return list(self.payloads)
        host, headers, bodies = f"{self.host}:{self.port}", dict(self.headers), self.payloads
        paths = self.paths or (self.path,) * len(bodies)
        return [
            build_request(self.method, path, host, bodies[i % len(bodies)], headers)
            for i, path in enumerate(paths)
        ]


@dataclass(frozen=True)
class LoadPlan:
    """One measured run. ``duration_s`` or ``requests`` bounds it (after ``warmup_s``)."""

    target: Target
    mode: Mode = "closed"
    concurrency: int = 1
    rate: float = 0.0
    arrival: Arrival = "constant"
    duration_s: float | None = 10.0
    requests: int | None = None
    warmup_s: float = 0.0
    timeout_s: float = 10.0
    seed: int = 0
    max_connections: int = 1024
    # Open loop in phases run back to back: ((seconds, rate), ...), constant arrivals; ``rate``
    # must then be the highest step (it splits over processes) and ``duration_s`` their sum.
    steps: tuple[tuple[float, float], ...] = ()
    timeline: bool = False  # keep (start, latency, status) of every answer: LoadResult.timeline
    phase: float = 0.0  # 0..1 of a gap: staggers the processes' constant schedules (split_plan)

    @classmethod
    def of(
        cls, target: Target, concurrency: int | None, rate: float | None, **fields: Any
    ) -> LoadPlan:
        """A run's load, read the same way from every description (``bench run``'s options, a
        scenario): an open loop at ``rate`` if one is given, else a closed loop."""
        if rate:
            return cls(target, "open", concurrency=0, rate=rate, **fields)
        return cls(target, "closed", concurrency=concurrency or 1, **fields)

    def check(self) -> None:
        if self.steps and (
            self.mode != "open"
            or any(not (sec > 0 and r > 0) for sec, r in self.steps)
            or self.rate != max(r for _, r in self.steps)
        ):
            raise BenchError("steps need open loop, positive seconds and rates, rate = max step")
        if self.mode == "closed" and self.concurrency < 1:
            raise BenchError("closed loop needs concurrency >= 1")
        if self.mode == "open" and not self.rate > 0:
            raise BenchError("open loop needs a rate > 0")
        if self.duration_s is None and self.requests is None:
            raise BenchError("give a duration or a number of requests")
        if not self.target.payloads:
            raise BenchError("no payloads to send")


@dataclass
class Part:
    """What one process measured, of the requests started inside its window (seconds), and with
    ``keep_timeline`` every answer's (start, latency, status) and request index, warm-up too."""

    window_start: float = 0.0
    keep_timeline: bool = False
    latency: array.array = field(default_factory=partial(array.array, "d"))
    service: array.array = field(default_factory=partial(array.array, "d"))
    lag: array.array = field(default_factory=partial(array.array, "d"))
    timeline: array.array = field(default_factory=partial(array.array, "d"))
    variants: array.array = field(default_factory=partial(array.array, "I"))
    statuses: Counter[str] = field(default_factory=Counter)
    completed: int = 0  # answers, warm-up included (progress)
    sent: int = 0
    last_done: float = 0.0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    capped: bool = False
    halted: bool = False  # stopped early by the parent (Ctrl-C)

    def count_sent(self, start: float) -> None:
        if start >= self.window_start:
            self.sent += 1

    def record(
        self, scheduled: float | None, sent: float, done: float, status: str, index: int
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


@dataclass(frozen=True)
class LoadResult:
    """One run as the client saw it. Latencies in ms; ``statuses`` maps "200", "503", ...,
    ``conn-error`` and ``timeout`` to counts over the measured window."""

    mode: Mode
    offered_rate: float | None
    concurrency: int | None
    window_s: float
    sent: int
    completed: int
    ok: int
    statuses: dict[str, int]
    latency: LatencySummary
    service: LatencySummary
    lag: LatencySummary
    req_per_s: float
    ok_per_s: float
    generator_cpu_pct: list[float]
    behind: list[str]
    generator_cpu_s: float = 0.0
    # With LoadPlan.timeline: flat float64 triples per answer, (start s after the window opened
    # (scheduled send in open loop), latency s, HTTP status or -1 for a connection error).
    timeline: bytes = field(default=b"", repr=False)
    # With LoadPlan.timeline: the index into Target.requests() of each timeline answer (uint32).
    variants: bytes = field(default=b"", repr=False)

    @property
    def errors(self) -> int:
        return self.sent - self.ok

    @property
    def error_rate(self) -> float:
        return error_rate(self.errors, self.sent)

    def as_dict(self) -> dict[str, Any]:
        head = ("mode", "offered_rate", "concurrency", "window_s", "sent", "completed", "ok")
        counts = ("errors", "error_rate", "statuses", "req_per_s", "ok_per_s")
        out = {name: getattr(self, name) for name in (*head, *counts)}
        latencies = {"latency": self.latency, "service_latency": self.service, "lag": self.lag}
        out |= {name: summary.as_dict() for name, summary in latencies.items()}
        return out | {"generator_cpu_pct": self.generator_cpu_pct, "behind": self.behind}


@dataclass(frozen=True)
class Progress:
    """Periodic totals across processes while a run is in flight."""

    elapsed_s: float
    completed: int
    recorded: int


def split_plan(plan: LoadPlan, processes: int) -> list[LoadPlan]:
    """Each process's plan: concurrency, rate (steps too) and the request budget divided over
    ``processes`` (the remainder to the first ones; the budget over those with a connection),
    constant schedules staggered by ``phase`` so that together they interleave evenly."""
    active = min(processes, plan.concurrency) if plan.mode == "closed" else processes

    def portion(total: int, i: int, n: int = processes) -> int:
        return total // n + (i < total % n) if i < n else 0

    return [
        replace(
            plan,
            concurrency=portion(plan.concurrency, i) if plan.mode == "closed" else 0,
            rate=plan.rate / processes if plan.mode == "open" else 0.0,
            steps=tuple((seconds, rate / processes) for seconds, rate in plan.steps),
            requests=None if plan.requests is None else portion(plan.requests, i, active),
            phase=i / processes,
            seed=plan.seed * 1009 + i,
        )
        for i in range(processes)
    ]


def merge(plan: LoadPlan, parts: list[Part]) -> LoadResult:
    """Combine the processes' measurements into one :class:`LoadResult`."""
    total = Part(window_start=min((p.window_start for p in parts), default=0.0))
    for part in parts:
        for name in ARRAYS:
            getattr(total, name).extend(getattr(part, name))
        total.statuses.update(part.statuses)
    completed = len(total.latency)
    ok = sum(n for code, n in total.statuses.items() if code.isdigit() and 200 <= int(code) < 300)
    last_done = max((p.last_done for p in parts), default=0.0)
    # A timed run's window is at least its duration (a few early answers must not inflate the
    # rate); a counted run's window ends at its last answer.
    window = max(0.0, last_done - total.window_start) if completed else 0.0
    halted = any(p.halted for p in parts)
    if plan.duration_s is not None and plan.requests is None and not halted:
        window = max(window, plan.duration_s)
    lag = summarize(total.lag)
    cpu_pct = [100.0 * p.cpu_s / p.wall_s if p.wall_s > 0 else math.nan for p in parts]
    behind = [f"interrupted: a partial run, {window:.2f} s measured"] if halted else []
    if plan.mode == "open" and lag.count and lag.p99_ms > LAG_WARN_MS:
        behind.append(f"p99 send lag {lag.p99_ms:.1f} ms > {LAG_WARN_MS:g} ms")
    if any(p.capped for p in parts):
        behind.append(f"all {plan.max_connections} connections busy; requests waited to be sent")
    if any(c > CPU_WARN_PCT for c in cpu_pct):
        behind.append(f"a generator process used > {CPU_WARN_PCT:g}% of a core")
    return LoadResult(
        mode=plan.mode,
        offered_rate=plan.rate if plan.mode == "open" else None,
        concurrency=plan.concurrency if plan.mode == "closed" else None,
        window_s=window,
        sent=sum(p.sent for p in parts),
        completed=completed,
        ok=ok,
        statuses=dict(sorted(total.statuses.items())),
        latency=summarize(total.latency),
        service=summarize(total.service),
        lag=lag,
        req_per_s=rate(completed, window),
        ok_per_s=rate(ok, window),
        generator_cpu_pct=cpu_pct,
        behind=behind,
        generator_cpu_s=sum(p.cpu_s for p in parts),
        timeline=total.timeline.tobytes(),
        variants=total.variants.tobytes(),
    )
