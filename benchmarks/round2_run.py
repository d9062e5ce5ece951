"""What round two's rows share beyond the runner (``runner.py`` starts the systems and
measures): a row's result (:class:`RowResult`) and its judged figures (:class:`Ratio`), the
in-process limit of the cnn, and how a system that was not given or that failed is recorded.

TorchServe gets the identical ``.mar`` (``torchbay archive`` with ``handler_raw.py``) and the same
config.properties values except torchbay-only keys (``runner.TORCHBAY_ONLY_KEYS``): TorchServe
0.12 has no such setting.
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass, field
from typing import Any

from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadResult
from torchbay.benchmarks.runner import TORCHSERVE, Ctx

INPROCESS = "in-process"
NOT_RUN = "not run"


def load_metrics(result: LoadResult) -> dict[str, float]:
    """req/s, p50/p99 and the error count of one closed-loop run."""
    return {
        "req_s": result.ok_per_s,
        "p50_ms": result.latency.p50_ms,
        "p99_ms": result.latency.p99_ms,
        "errors": float(result.errors),
    }


@dataclass(frozen=True)
class Ratio:
    """A figure per repeat and, when ``bound`` is set, its target: ``aggregate`` (median, min or
    max over the repeats) ``op`` ``bound``."""

    name: str
    values: list[float]
    bound: float | None = None
    op: str = ">="
    aggregate: str = "median"

    def summary(self) -> float:
        finite = sorted(v for v in self.values if math.isfinite(v))
        if len(finite) != len(self.values) or not finite:
            return math.nan
        if self.aggregate == "min":
            return finite[0]
        if self.aggregate == "max":
            return finite[-1]
        mid = len(finite) // 2
        return finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2

    def met(self) -> bool | None:
        if self.bound is None:
            return None
        value = self.summary()
        if not math.isfinite(value):
            return False
        return value >= self.bound if self.op == ">=" else value <= self.bound


@dataclass
class RowResult:
    key: str
    title: str
    settings: str
    systems: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    ratios: list[Ratio] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. the load generator fell behind
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, system: str, metrics: dict[str, float]) -> None:
        self.systems.setdefault(system, []).append(metrics)

    def series(self, system: str, metric: str) -> list[float]:
        return [m.get(metric, math.nan) for m in self.systems.get(system, [])]


def ratio(top: float, bottom: float) -> float:
    if not (math.isfinite(top) and math.isfinite(bottom)) or bottom <= 0:
        return math.nan
    return top / bottom


def ratios(top: list[float], bottom: list[float]) -> list[float]:
    """:func:`ratio` of two series, repeat by repeat."""
    return [ratio(t, b) for t, b in zip(top, bottom, strict=False)]


def inprocess_limit(ctx: Ctx, batch: int, streams: int, env: dict | None = None) -> float:
    """samples/s of ``streams`` single-threaded loops of the cnn in one fresh process (``env``:
    its environment, None: ours)."""
    cmd = [ctx.python, "-m", "torchbay.benchmarks.ceilings.inprocess", "--json"]
    cmd += ["--pt", f"cnn={ctx.assets.pt['cnn']}", "--batches", str(batch)]
    cmd += ["--streams", str(streams), "--seconds", str(ctx.duration_s)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise BenchError(f"in-process loop failed: {proc.stderr.strip()[-300:]}")
    return float(json.loads(proc.stdout)["cnn"][str(batch)])


def systems_for(ctx: Ctx, row: RowResult, *names: str) -> list[str]:
    """``names`` less TorchServe when it was not given (marked "not run")."""
    if ctx.torchserve is None and TORCHSERVE in names:
        row.not_run[TORCHSERVE] = f"{NOT_RUN} (no --torchserve)"
    return [n for n in names if n != TORCHSERVE or ctx.torchserve is not None]


def failed(row: RowResult, system: str, rep: int, exc: Exception, keys: tuple[str, ...]) -> None:
    """Record ``system`` 's failure in repeat ``rep``: its error, and NaN for ``keys``."""
    row.errors.append(f"repeat {rep} {system}: {str(exc).splitlines()[0]}")
    row.add(system, dict.fromkeys(keys, math.nan))
