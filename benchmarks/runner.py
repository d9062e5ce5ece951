"""Run scenarios: build the models and archives, start each server (:class:`ManagedServer`, port
0, ready file), time its first answer, warm up, measure with the load generator (closed loop),
read the server tree's CPU and memory, stop it.

Everything lands under ``out_dir`` (``benchmarks/out/`` by default, gitignored): ``models/``
(scripted ``.pt`` and raw bodies), ``model_store/`` (``.mar``), ``runs/<scenario>-r<round>/``
(config.properties and the server log).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from torchbay.benchmarks import managed, models, procstat
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, Target
from torchbay.benchmarks.scenarios import Scenario, ScenarioResult, torchbay_models_json

HANDLER_FILE = Path(__file__).with_name("handler_raw.py")
MODEL_VERSION = "1.0"
_OCTETS = (("Content-Type", "application/octet-stream"),)


@dataclass(frozen=True)
class RunSettings:
    """How long and how often to measure. ``repeat`` rounds run every scenario once each."""

    out_dir: Path
    warmup_s: float = 5.0
    duration_s: float = 20.0
    repeat: int = 2
    start_timeout_s: float = 60.0
    inprocess_seconds: float = 2.0
    python: str = sys.executable


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


def archive_models(assets: Assets, out_dir: Path, python: str) -> Assets:
    """Pack each scripted model with ``handler_raw.py`` into ``out_dir/model_store/NAME.mar``."""
    store = out_dir / "model_store"
    store.mkdir(parents=True, exist_ok=True)
    base = [python, "-m", "torchbay", "archive"]
    for name, pt in assets.pt.items():
        (store / f"{name}.mar").unlink(missing_ok=True)
        cmd = [
            *base,
            *("--model-name", name, "--version", MODEL_VERSION),
            *("--serialized-file", str(pt), "--handler", str(HANDLER_FILE)),
            *("--export-path", str(store)),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not (store / f"{name}.mar").is_file():
            raise BenchError(f"torchbay archive failed for {name}: {proc.stderr or proc.stdout}")
    return Assets(pt=assets.pt, body=assets.body, model_store=store)


def make_server(
    scenario: Scenario, assets: Assets, run_dir: Path, python: str
) -> managed.ManagedServer:
    """The server under test for ``scenario``: a ceiling, or ``torchbay serve`` with the
    scenario's batching in a config.properties (no auth, no snapshot)."""
    if scenario.server == "echo":
        cmd = [python, "-m", "torchbay.benchmarks.ceilings.echo_asgi"]
        return managed.ManagedServer(cmd, run_dir)
    if scenario.server == "naive":
        cmd = [python, "-m", "torchbay.benchmarks.ceilings.naive_fastapi"]
        cmd += ["--model", scenario.model, "--pt", str(assets.pt[scenario.model])]
        return managed.ManagedServer(cmd, run_dir)
    if assets.model_store is None:
        raise BenchError("torchbay scenarios need archives; call archive_models first")
    config = run_dir / "config.properties"
    config.write_text(f"models={json.dumps(torchbay_models_json(scenario, MODEL_VERSION))}\n")
    extra = ("--ncs", "--ts-config", str(config.resolve()), *scenario.server_args)
    archive = assets.model_store / f"{scenario.model}.mar"
    return managed.ManagedServer.torchbay(
        archive, run_dir, auth=False, extra_args=extra, name=scenario.model, python=python
    )


def run_scenario(
    scenario: Scenario,
    assets: Assets,
    settings: RunSettings,
    round_no: int,
    gen: LoadGenerator,
) -> ScenarioResult:
    """Start the server, time its first answer, warm up, measure, stop. Never raises BenchError:
    a failed run comes back with ``error`` set so the other scenarios still run."""
    run_dir = settings.out_dir / "runs" / f"{scenario.name}-r{round_no}"
    run_dir.mkdir(parents=True, exist_ok=True)
    path = f"/predictions/{scenario.model}"
    body = assets.body[scenario.model].read_bytes()
    server: managed.ManagedServer | None = None
    try:
        server = make_server(scenario, assets, run_dir, settings.python)
        server.start_timeout_s = settings.start_timeout_s
        endpoints = server.start()
        start_s = server.first_answer(path, body, settings.start_timeout_s)
        target = Target("127.0.0.1", endpoints.inference_port, path, (body,), _OCTETS)
        plan = _plan(scenario, target, settings.duration_s)
        if settings.warmup_s > 0:
            gen.run(dataclasses.replace(plan, duration_s=settings.warmup_s))
        before = procstat.cpu_snapshot(server.pid)
        busy0, wall0 = procstat.system_busy_seconds(), time.monotonic()
        load = gen.run(plan)
        busy1, wall1 = procstat.system_busy_seconds(), time.monotonic()
        after = procstat.cpu_snapshot(server.pid)
        memory = procstat.memory_snapshot(server.pid)
    except (BenchError, psutil.NoSuchProcess) as exc:
        log = str(server.log_path) if server else None
        return ScenarioResult(scenario.name, round_no, error=str(exc), log=log)
    finally:
        if server is not None:
            server.stop()
    cpu_s = procstat.cpu_seconds_between(before, after)
    return ScenarioResult(
        scenario=scenario.name,
        round=round_no,
        req_per_s=load.req_per_s,
        p50_ms=load.latency.p50_ms,
        p90_ms=load.latency.p90_ms,
        p99_ms=load.latency.p99_ms,
        requests=load.completed,
        errors=load.errors,
        cpu_ms_per_req=procstat.cpu_ms_per_request(cpu_s, load.completed),
        frontend_rss_mb=memory.frontend_rss_mb,
        tree_rss_mb=memory.tree_rss_mb,
        tree_pss_mb=float("nan") if memory.tree_pss_mb is None else memory.tree_pss_mb,
        processes=memory.processes,
        start_s=start_s,
        foreign_cpu_pct=procstat.foreign_cpu_percent(
            busy1 - busy0, cpu_s, load.generator_cpu_s, wall1 - wall0, os.cpu_count() or 1
        ),
        log=str(server.log_path),
    )


def _plan(scenario: Scenario, target: Target, duration_s: float) -> LoadPlan:
    """The scenario's load: closed loop at its concurrency, or open loop at its rate."""
    if scenario.rate is not None:
        return LoadPlan(target, "open", rate=scenario.rate, arrival=scenario.arrival,
                        duration_s=duration_s)  # fmt: skip
    return LoadPlan(target, "closed", scenario.concurrency or 1, duration_s=duration_s)


def run_inprocess(assets: Assets, settings: RunSettings) -> dict[str, dict[int, float]]:
    """The in-process model loop, in a fresh process (one thread, nothing else loaded)."""
    cmd = [settings.python, "-m", "torchbay.benchmarks.ceilings.inprocess", "--json"]
    cmd += ["--seconds", str(settings.inprocess_seconds)]
    for name, pt in assets.pt.items():
        cmd += ["--pt", f"{name}={pt}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"in-process loop failed: {proc.stderr.strip()}")
    raw = json.loads(proc.stdout)
    return {name: {int(b): rate for b, rate in per.items()} for name, per in raw.items()}
