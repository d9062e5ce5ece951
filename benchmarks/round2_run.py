"""What every round-two row shares: the run context (settings, archives, the load generator,
progress with an ETA), starting the systems under test (torchbay, TorchServe, the echo ceiling)
with the same ``models={...}`` and config.properties keys, and one closed- or open-loop load.

TorchServe gets the identical ``.mar`` (``torchbay archive`` with ``handler_raw.py``) and the same
config.properties values except torchbay-only keys (``max_queue_delay_ms``): TorchServe 0.12 has no
such setting.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchbay.benchmarks import managed, runner
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, LoadResult, Target

TORCHBAY, TORCHSERVE, ECHO, INPROCESS = "torchbay", "torchserve", "echo", "in-process"
TORCHBAY_ONLY_KEYS = ("max_queue_delay_ms", "cpu_thread_budget")
NOT_RUN = "not run"
_OCTETS = (("Content-Type", "application/octet-stream"),)


@dataclass(frozen=True)
class Batching:
    """One model's batching and scale (the ``models={...}`` entry)."""

    batch_size: int = 1
    max_batch_delay_ms: int = 0
    workers: int = 1

    def label(self) -> str:
        return f"batch {self.batch_size}, delay {self.max_batch_delay_ms} ms, {self.workers} w"


def models_json(models: dict[str, Batching]) -> dict[str, Any]:
    """TorchServe's ``models={...}`` for ``{name: batching}``; every name serves its own mar."""
    return {
        name: {
            runner.MODEL_VERSION: {
                "defaultVersion": True,
                "marName": f"{name}.mar",
                "minWorkers": b.workers,
                "maxWorkers": b.workers,
                "batchSize": b.batch_size,
                "maxBatchDelay": b.max_batch_delay_ms,
            }
        }
        for name, b in models.items()
    }


@dataclass
class Ctx:
    """One round-two run: settings, archives, the load generator, and the clock for the ETA."""

    out_dir: Path
    assets: runner.Assets
    gen: LoadGenerator
    duration_s: float = 10.0
    warmup_s: float = 3.0
    repeat: int = 3
    torchserve: Path | None = None
    python: str = sys.executable
    start_timeout_s: float = 120.0
    starts: int = 3  # the start row's samples per system (at least; ``repeat`` if more)
    estimate_s: float = 0.0
    done_estimate_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    log: Any = print

    def progress(self, what: str, estimate_s: float) -> None:
        """Count ``estimate_s`` as done and print ``what`` with the elapsed time and an ETA
        (the remaining estimate scaled by how fast the run has gone so far)."""
        self.done_estimate_s += estimate_s
        elapsed = time.monotonic() - self.started
        left = max(0.0, self.estimate_s - self.done_estimate_s)
        pace = elapsed / self.done_estimate_s if self.done_estimate_s > 0 else 1.0
        self.log(f"[{elapsed:6.0f} s, ~{left * pace:5.0f} s left] {what}", flush=True)

    def model_store(self, names: dict[str, str]) -> Path:
        """A store where each name in ``names`` (name -> reference model) is its own ``.mar``
        (a copy of the reference archive, so two names can serve one model)."""
        assert self.assets.model_store is not None
        if all(name == model for name, model in names.items()):
            return self.assets.model_store
        store = self.out_dir / "stores" / "-".join(sorted(names))
        store.mkdir(parents=True, exist_ok=True)
        for name, model in names.items():
            src = self.assets.model_store / f"{model}.mar"
            (store / f"{name}.mar").write_bytes(src.read_bytes())
        return store


def start_system(
    ctx: Ctx,
    system: str,
    models: dict[str, Batching],
    run_dir: Path,
    *,
    names: dict[str, str] | None = None,
    props: dict[str, Any] | None = None,
) -> managed.ManagedServer:
    """Start ``system`` serving ``models`` (name -> batching; ``names`` maps a name to its
    reference model when they differ) with ``props`` in config.properties; it is ready."""
    names = names or {name: name for name in models}
    props = props or {}
    store = ctx.model_store(names)
    if system == TORCHSERVE:
        if ctx.torchserve is None:
            raise BenchError("TorchServe was not given")
        ts_props = {k: v for k, v in props.items() if k not in TORCHBAY_ONLY_KEYS}
        mars = {name: f"{name}.mar" for name in models}
        server: managed.ManagedServer = managed.TorchServeServer.build(
            ctx.torchserve, store, mars, run_dir, models_json(models), ts_props
        )
    elif system == ECHO:
        server = managed.ManagedServer(
            [ctx.python, "-m", "torchbay.benchmarks.ceilings.echo_asgi"], run_dir
        )
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        config = run_dir / "config.properties"
        lines = [f"models={json.dumps(models_json(models))}"]
        lines += [f"{key}={value}" for key, value in props.items()]
        config.write_text("\n".join(lines) + "\n")
        cmd = [
            *(ctx.python, "-m", "torchbay", "serve", "--model-store", str(store.resolve())),
            *("--models", *(f"{name}={name}.mar" for name in models)),
            *("--inference-address", "http://127.0.0.1:0"),
            *("--management-address", "http://127.0.0.1:0"),
            *("--metrics-address", "http://127.0.0.1:0"),
            *("--disable-token-auth", "--ncs", "--ts-config", str(config.resolve())),
        ]
        server = managed.ManagedServer(cmd, run_dir)
    server.start_timeout_s = ctx.start_timeout_s
    server.start()
    return server


@contextmanager
def serving(
    ctx: Ctx, system: str, models: dict[str, Batching], run_dir: Path, **kw: Any
) -> Iterator[managed.ManagedServer]:
    server = start_system(ctx, system, models, run_dir, **kw)
    try:
        yield server
    finally:
        server.stop()


def target(ctx: Ctx, server: managed.ManagedServer, name: str, model: str) -> Target:
    """POST the reference body of ``model`` to ``/predictions/name``."""
    assert server.endpoints is not None
    body = ctx.assets.body[model].read_bytes()
    port = server.endpoints.inference_port
    return Target("127.0.0.1", port, f"/predictions/{name}", (body,), _OCTETS)


def warm_and_measure(
    ctx: Ctx, plan: LoadPlan, gen: LoadGenerator | None = None, warm: bool = True
) -> LoadResult:
    """Warm up for ``ctx.warmup_s`` (closed loop at the plan's concurrency, or its rate), then
    run ``plan``."""
    gen = gen or ctx.gen
    if warm and ctx.warmup_s > 0:
        warmup = dataclasses.replace(plan, duration_s=ctx.warmup_s, steps=(), timeline=False)
        if warmup.mode == "open":
            warmup = dataclasses.replace(
                warmup, rate=min(r for _, r in plan.steps or ((1, plan.rate),))
            )
        gen.run(warmup)
    return gen.run(plan)


def closed(ctx: Ctx, tgt: Target, concurrency: int, gen: LoadGenerator | None = None) -> LoadResult:
    plan = LoadPlan(tgt, "closed", concurrency, duration_s=ctx.duration_s)
    return warm_and_measure(ctx, plan, gen)


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
