"""The reference scenarios of issue 3 and the targets that compare them within one run.

A :class:`Scenario` names a server (the bare ASGI echo, the naive FastAPI server, or
``torchbay serve``), a reference model, the load (concurrency) and, for torchbay, the batching
and worker settings. A :class:`Target` compares two scenarios' medians (a ratio) or bounds one
scenario's metric; ``runner.py`` runs scenarios and ``report.py`` evaluates the targets.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from torchbay.benchmarks.errors import BenchError

ServerKind = Literal["echo", "naive", "torchbay"]
Metric = Literal["req_per_s", "p50_ms", "p90_ms", "p99_ms", "frontend_rss_mb", "start_s"]


@dataclass(frozen=True)
class Scenario:
    """One server under one closed-loop load. Batching fields apply to torchbay only."""

    name: str
    server: ServerKind
    model: str
    concurrency: int
    batch_size: int = 1
    max_batch_delay_ms: int = 0
    workers: int = 1
    tags: tuple[str, ...] = ()
    about: str = ""
    server_args: tuple[str, ...] = ()  # extra `torchbay serve` flags

    def matches(self, pattern: str) -> bool:
        """True if ``pattern`` is this scenario's name (glob allowed), its server or a tag."""
        return (
            fnmatch.fnmatchcase(self.name, pattern)
            or pattern == self.server
            or pattern in self.tags
        )


@dataclass(frozen=True)
class Target:
    """``numerator.metric / denominator.metric >= bound`` (ratio) or ``numerator.metric < bound``
    (limit, when ``denominator`` is None)."""

    key: str
    about: str
    numerator: str
    metric: Metric
    bound: float
    denominator: str | None = None

    def value(self, medians: dict[str, dict[str, float]]) -> float | None:
        """The measured ratio or value from per-scenario medians; None if a side is missing."""
        top = medians.get(self.numerator, {}).get(self.metric)
        if top is None or math.isnan(top):
            return None
        if self.denominator is None:
            return top
        bottom = medians.get(self.denominator, {}).get(self.metric)
        if not bottom or math.isnan(bottom):
            return None
        return top / bottom

    def met(self, value: float) -> bool:
        return value >= self.bound if self.denominator is not None else value < self.bound

    def describe_bound(self) -> str:
        return f">= {self.bound:g}x" if self.denominator is not None else f"< {self.bound:g}"


@dataclass(frozen=True)
class ScenarioResult:
    """One measured run of one scenario; ``error`` is set (and numbers NaN) if it failed."""

    scenario: str
    round: int
    req_per_s: float = float("nan")
    p50_ms: float = float("nan")
    p90_ms: float = float("nan")
    p99_ms: float = float("nan")
    requests: int = 0
    errors: int = 0
    cpu_ms_per_req: float = float("nan")
    frontend_rss_mb: float = float("nan")
    tree_rss_mb: float = float("nan")
    tree_pss_mb: float = float("nan")
    processes: int = 0
    start_s: float = float("nan")
    foreign_cpu_pct: float = float("nan")
    error: str | None = None
    log: str | None = None


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("echo-c16", "echo", "tiny", 16, tags=("ceiling",), about="bare raw-ASGI echo"),
    Scenario(
        "naive-tiny-c16", "naive", "tiny", 16, tags=("ceiling",), about="FastAPI sync endpoint"
    ),
    Scenario("naive-cnn-c10", "naive", "cnn", 10, tags=("ceiling",), about="FastAPI sync endpoint"),
    Scenario(
        "tb-tiny-c16-b8-w1", "torchbay", "tiny", 16, 8, 5, 1, tags=("a", "d"), about="target a, d"
    ),
    Scenario(
        "tb-tiny-c16-b8-w1-nolog",
        "torchbay",
        "tiny",
        16,
        8,
        5,
        1,
        tags=("a",),
        about="target a without the access log",
        server_args=("--no-access-log",),
    ),
    Scenario("tb-cnn-c1-b1-w1", "torchbay", "cnn", 1, 1, 10, 1, tags=("b",), about="target b"),
    Scenario("tb-cnn-c1-b8-w1", "torchbay", "cnn", 1, 8, 10, 1, tags=("b",), about="target b"),
    Scenario("tb-cnn-c10-b1-w2", "torchbay", "cnn", 10, 1, 10, 2, tags=("c",), about="target c"),
)

TARGETS: tuple[Target, ...] = (
    Target("a", "tiny c16 b8 w1 vs bare ASGI echo", "tb-tiny-c16-b8-w1", "req_per_s", 0.30,
           "echo-c16"),
    Target("a-nolog", "same, --no-access-log", "tb-tiny-c16-b8-w1-nolog", "req_per_s", 0.30,
           "echo-c16"),
    Target("b", "cnn c1: batch 8 vs batch 1", "tb-cnn-c1-b8-w1", "req_per_s", 0.95,
           "tb-cnn-c1-b1-w1"),
    Target("c", "cnn c10 b1 w2 vs naive FastAPI", "tb-cnn-c10-b1-w2", "req_per_s", 1.0,
           "naive-cnn-c10"),
    Target("c-p99", "cnn c10 b1 w2 p99 (ms)", "tb-cnn-c10-b1-w2", "p99_ms", 60.0),
    Target("d-rss", "frontend RSS (MB), tiny", "tb-tiny-c16-b8-w1", "frontend_rss_mb", 100.0),
    Target("d-start", "start to first answer (s), tiny", "tb-tiny-c16-b8-w1", "start_s", 1.5),
)  # fmt: skip


def select(
    patterns: Iterable[str] | None, scenarios: Iterable[Scenario] = SCENARIOS
) -> list[Scenario]:
    """Scenarios matching any pattern (name glob, server kind or tag); all when none given.
    Raises BenchError when a pattern matches nothing, so a typo never runs an empty benchmark."""
    scenarios = list(scenarios)
    patterns = [p for p in (patterns or []) if p]
    if not patterns:
        return scenarios
    chosen = []
    for pattern in patterns:
        if not any(s.matches(pattern) for s in scenarios):
            names = ", ".join(s.name for s in scenarios)
            raise BenchError(f"no scenario matches {pattern!r}; known: {names}")
    for scenario in scenarios:
        if any(scenario.matches(p) for p in patterns):
            chosen.append(scenario)
    return chosen


def torchbay_models_json(scenario: Scenario, version: str = "1.0") -> dict:
    """TorchServe's ``models={...}`` entry for a torchbay scenario (config.properties)."""
    return {
        scenario.model: {
            version: {
                "defaultVersion": True,
                "marName": f"{scenario.model}.mar",
                "minWorkers": scenario.workers,
                "maxWorkers": scenario.workers,
                "batchSize": scenario.batch_size,
                "maxBatchDelay": scenario.max_batch_delay_ms,
            }
        }
    }
