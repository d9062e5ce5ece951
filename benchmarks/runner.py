"""The one runner every benchmark table measures through: the reference models and archives, a
system under test from one ``models={...}`` description (:func:`make_system`; config and log in
``runs/<name>/``), and a table's rows (:func:`run_rows`): repeat outermost, a failure NaN."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from torchbay.archiver.errors import ArchiveError
from torchbay.benchmarks import bench, managed, models
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, LoadResult, Target
from torchbay.benchmarks.report import Eta, Ratio, RowResult, failed, fmt
from torchbay.benchmarks.scenarios import Batching, Goal, models_json

HANDLER_FILE = Path(__file__).with_name("handler_raw.py")
MODEL_VERSION = "1.0"
TORCHBAY, TORCHSERVE, ECHO = "torchbay", "torchserve", "echo"
# config.properties keys TorchServe 0.12 does not have; it gets every other key unchanged.
TORCHBAY_ONLY_KEYS = ("max_queue_delay_ms", "cpu_thread_budget")
OCTETS = (("Content-Type", "application/octet-stream"),)
FAILURES = (BenchError, ArchiveError, psutil.Error)  # a failed cell; anything else is a bug


@dataclass(frozen=True)
class Assets:
    """Files the servers need: scripted models, bodies, and (for torchbay) the model store."""

    pt: dict[str, Path]
    body: dict[str, Path]
    model_store: Path | None = None


def prepare_models(out_dir: Path) -> Assets:
    """Script both reference models and write one body file per model."""
    model_dir = out_dir / "models"
    model_dir.mkdir(parents=True, exist_ok=True)
    pt, body = {}, {}
    for name in models.MODEL_NAMES:
        pt[name] = models.save_scripted(models.build(name), model_dir / f"{name}.pt")
        body[name] = model_dir / f"{name}.bin"
        body[name].write_bytes(models.sample_body(name))
    return Assets(pt=pt, body=body)


def archive(
    name: str, pt: Path, store: Path, python: str, *extra: str, handler: str = str(HANDLER_FILE)
) -> Path:
    """``store/NAME.mar`` by ``torchbay archive``: the benchmarks' one way to build an archive."""
    (store / f"{name}.mar").unlink(missing_ok=True)
    cmd = [
        *(python, "-m", "torchbay", "archive"),
        *("--model-name", name, "--version", MODEL_VERSION),
        *("--serialized-file", str(pt), "--handler", handler),
        *("--export-path", str(store), *extra),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not (store / f"{name}.mar").is_file():
        raise BenchError(f"torchbay archive failed for {name}: {proc.stderr or proc.stdout}")
    return store / f"{name}.mar"


def archive_models(assets: Assets, out_dir: Path, python: str) -> Assets:
    """Pack each scripted model into ``out_dir/model_store/NAME.mar`` (:func:`archive`)."""
    store = out_dir / "model_store"
    store.mkdir(parents=True, exist_ok=True)
    for name, pt in assets.pt.items():
        archive(name, pt, store, python)
    return Assets(pt=assets.pt, body=assets.body, model_store=store)


@dataclass
class Ctx:
    """One benchmark run: its settings, archives, the load generator and the ETA it prints."""

    out_dir: Path
    assets: Assets
    gen: LoadGenerator
    duration_s: float = 10.0
    warmup_s: float = 3.0
    repeat: int = 3
    torchserve: Path | None = None
    python: str = sys.executable
    start_timeout_s: float = 120.0
    starts: int = 3  # the start row's samples per system (at least; ``repeat`` if more)
    log: Any = print
    eta: Eta = field(default_factory=lambda: Eta(0.0, print))

    def model_store(self, names: dict[str, str]) -> Path:
        """A store where each name in ``names`` (name -> reference model) is its own ``.mar``
        (a copy of the reference archive, so two names can serve one model)."""
        if self.assets.model_store is None:
            raise BenchError("torchbay and TorchServe need archives; call archive_models first")
        if all(name == model for name, model in names.items()):
            return self.assets.model_store
        store = self.out_dir / "stores" / "-".join(sorted(names))
        store.mkdir(parents=True, exist_ok=True)
        for name, model in names.items():
            src = self.assets.model_store / f"{model}.mar"
            (store / f"{name}.mar").write_bytes(src.read_bytes())
        return store


def make_system(
    ctx: Ctx,
    system: str,
    served: dict[str, Batching],
    run_dir: Path,
    *,
    names: dict[str, str] | None = None,
    props: dict[str, Any] | None = None,
    args: tuple[str, ...] = (),
) -> managed.ManagedServer:
    """``system`` serving ``served`` (name -> batching; ``names`` maps a name to its reference
    model when they differ) with ``props`` in config.properties and ``args`` as extra
    ``torchbay serve`` flags; not started yet. The ceiling (echo) takes no model."""
    names = names or {name: name for name in served}
    store, props = ctx.model_store(names) if system in (TORCHBAY, TORCHSERVE) else None, props or {}
    if system == ECHO:
        cmd = [ctx.python, "-m", "torchbay.benchmarks.echo_asgi"]
        server = managed.ManagedServer(cmd, run_dir)
    elif system == TORCHSERVE:
        if ctx.torchserve is None:
            raise BenchError("TorchServe was not given")
        ts_props = {k: v for k, v in props.items() if k not in TORCHBAY_ONLY_KEYS}
        mars = {name: f"{name}.mar" for name in served}
        server = managed.TorchServeServer.build(
            ctx.torchserve, store, mars, run_dir, models_json(served, MODEL_VERSION), ts_props
        )
    else:
        config = managed.write_properties(run_dir, models_json(served, MODEL_VERSION), props)
        flags = ("--ncs", "--ts-config", str(config.resolve()), *args)
        loaded = tuple(f"{name}={name}.mar" for name in served)
        first = store / f"{next(iter(served))}.mar"
        server = managed.ManagedServer.torchbay(
            first, run_dir, auth=False, extra_args=flags, python=ctx.python, models=loaded
        )
    server.start_timeout_s = ctx.start_timeout_s
    return server


@contextmanager
def serving(
    ctx: Ctx, system: str, served: dict[str, Batching], run_dir: Path, **kw: Any
) -> Iterator[managed.ManagedServer]:
    """:func:`make_system`, started (ready when this yields) and stopped after."""
    server = make_system(ctx, system, served, run_dir, **kw)
    with server:
        yield server


def target(ctx: Ctx, server: managed.ManagedServer, name: str, model: str) -> Target:
    """POST the reference body of ``model`` to ``/predictions/name``."""
    assert server.endpoints is not None
    body = ctx.assets.body[model].read_bytes()
    port = server.endpoints.inference_port
    return Target("127.0.0.1", port, f"/predictions/{name}", (body,), OCTETS)


def warm_up(ctx: Ctx, plan: LoadPlan, gen: LoadGenerator | None = None) -> None:
    """``ctx.warmup_s`` of the plan's load (:func:`bench.warm_up`)."""
    bench.warm_up(gen or ctx.gen, plan, ctx.warmup_s)


def warm_and_measure(
    ctx: Ctx, plan: LoadPlan, gen: LoadGenerator | None = None, warm: bool = True
) -> LoadResult:
    """One unwatched :func:`bench.window`: ``ctx.warmup_s`` of warm-up unless ``warm`` is False."""
    warmup_s = ctx.warmup_s if warm else 0.0
    return bench.window(gen or ctx.gen, plan, lambda: None, warmup_s=warmup_s)[0]


def systems_for(ctx: Ctx, row: RowResult, *names: str) -> list[str]:
    """``names`` less TorchServe when it was not given (marked "not run")."""
    if ctx.torchserve is None and TORCHSERVE in names:
        row.not_run[TORCHSERVE] = "not run (no --torchserve)"
    return [n for n in names if n != TORCHSERVE or ctx.torchserve is not None]


def beside_torchserve(systems: list[str], *goals: Goal) -> list[Goal]:
    """``goals`` that need TorchServe's figures, when it runs."""
    return list(goals) if TORCHSERVE in systems else []


def run_dir(ctx: Ctx, *parts: object) -> Path:
    """``runs/PART-PART-...``: where a server's config and log go."""
    return ctx.out_dir / "runs" / "-".join(map(str, parts))


def closed(ctx: Ctx, tgt: Target, concurrency: int, gen: LoadGenerator | None = None) -> LoadResult:
    plan = LoadPlan(tgt, "closed", concurrency, duration_s=ctx.duration_s)
    return warm_and_measure(ctx, plan, gen)


@dataclass(frozen=True)
class Cell:
    """One measurement of a row in one round, filling ``labels`` (one system each): ``measure``
    takes the round and returns each label's metrics."""

    labels: tuple[str, ...]
    measure: Callable[[int], dict[str, dict[str, float]]]
    estimate_s: float = 0.0


@dataclass
class Row:
    """A table's row: the cells each round measures, the metrics a failed cell sets to NaN (the
    first is the progress line's), its goals and ``judge`` (other figures), rounds (0: repeat)."""

    result: RowResult
    cells: list[Cell]
    keys: tuple[str, ...]
    goals: Sequence[Goal] = ()
    judge: Callable[[RowResult], list[Ratio]] = lambda row: []
    rounds: int = 0


def run_rows(ctx: Ctx, rows: list[Row]) -> list[RowResult]:
    """Every round measures each row's cells once (so drift over time spreads across them), then
    each row is judged. A cell that fails leaves NaN and its error; the others still run."""
    rounds = {id(row): row.rounds or ctx.repeat for row in rows}
    total = sum(c.estimate_s * rounds[id(row)] for row in rows for c in row.cells)
    ctx.eta = Eta(total, lambda line: ctx.log(line, flush=True))
    ctx.log(
        f"{len(rows)} row(s), {ctx.repeat} repeat(s); estimate ~{total / 60:.1f} min", flush=True
    )
    for rnd in range(1, max(rounds.values(), default=0) + 1):
        for row in (row for row in rows if rnd <= rounds[id(row)]):
            for cell in row.cells:
                _measure(ctx, row, cell, rnd)
    for row in rows:
        row.result.ratios += [g.ratio(row.result) for g in row.goals] + row.judge(row.result)
    return [row.result for row in rows]


def _measure(ctx: Ctx, row: Row, cell: Cell, rnd: int) -> None:
    result = row.result
    try:
        for label, metrics in cell.measure(rnd).items():
            result.add(label, metrics)
        key = row.keys[0]
        status = ", ".join(f"{x} {fmt(result.series(x, key)[-1], key)}" for x in cell.labels)
    except FAILURES as exc:
        for label in cell.labels:
            failed(result, label, rnd, exc, row.keys)
        status = f"FAILED: {result.errors[-1]} (logs: {ctx.out_dir / 'runs'})"
    ctx.eta.tick(f"{result.key} repeat {rnd}: {status}", cell.estimate_s)
