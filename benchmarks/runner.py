"""Run scenarios: build the models and archives, start each server on free ports, wait for its
first answer, warm up, measure with wrk, read the server tree's CPU and memory, stop it.

Everything lands under ``out_dir`` (``benchmarks/out/`` by default, gitignored): ``models/``
(scripted ``.pt`` and raw bodies), ``model_store/`` (``.mar``), ``runs/<scenario>-r<round>/``
(config.properties and the server log).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from torchbay.benchmarks import models, procstat, wrk
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.scenarios import Scenario, torchbay_models_json

HANDLER_FILE = Path(__file__).with_name("handler_raw.py")
MODEL_VERSION = "1.0"


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
    archiver: str | None = None


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


def _has_torchbay_archive(python: str) -> bool:
    probe = subprocess.run(
        [python, "-m", "torchbay", "archive", "--help"], capture_output=True, text=True
    )
    return probe.returncode == 0


def archiver_command(python: str) -> tuple[str, list[str]]:
    """``torchbay archive`` when it exists, else TorchServe's ``torch-model-archiver``."""
    if _has_torchbay_archive(python):
        return "torchbay archive", [python, "-m", "torchbay", "archive"]
    tma = shutil.which("torch-model-archiver") or str(
        Path(python).with_name("torch-model-archiver")
    )
    if not Path(tma).exists():
        raise BenchError("neither `torchbay archive` nor torch-model-archiver is available")
    return "torch-model-archiver", [tma]


def archive_models(assets: Assets, out_dir: Path, python: str) -> Assets:
    """Pack each scripted model with ``handler_raw.py`` into ``out_dir/model_store/NAME.mar``."""
    store = out_dir / "model_store"
    store.mkdir(parents=True, exist_ok=True)
    label, base = archiver_command(python)
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
            raise BenchError(f"{label} failed for {name}: {proc.stderr.strip() or proc.stdout}")
    return Assets(pt=assets.pt, body=assets.body, model_store=store, archiver=label)


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports the OS just handed out (free now; a race is possible but
    the server fails loudly on a taken port)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def server_command(
    scenario: Scenario, assets: Assets, ports: list[int], run_dir: Path, python: str
) -> list[str]:
    """The command that starts ``scenario``'s server on ``ports[0]`` (torchbay uses three)."""
    if scenario.server == "echo":
        return [python, "-m", "torchbay.benchmarks.ceilings.echo_asgi", "--port", str(ports[0])]
    if scenario.server == "naive":
        return [
            *(python, "-m", "torchbay.benchmarks.ceilings.naive_fastapi", "--port", str(ports[0])),
            *("--model", scenario.model, "--pt", str(assets.pt[scenario.model])),
        ]
    if assets.model_store is None:
        raise BenchError("torchbay scenarios need archives; call archive_models first")
    config = run_dir / "config.properties"
    config.write_text(f"models={json.dumps(torchbay_models_json(scenario, MODEL_VERSION))}\n")
    inference, management, metrics = ports
    return [
        *(python, "-m", "torchbay", "serve", "--model-store", str(assets.model_store)),
        *("--models", f"{scenario.model}={scenario.model}.mar", "--ncs", "--disable-token-auth"),
        *("--inference-address", f"http://127.0.0.1:{inference}"),
        *("--management-address", f"http://127.0.0.1:{management}"),
        *("--metrics-address", f"http://127.0.0.1:{metrics}"),
        *("--ts-config", str(config)),
        *scenario.server_args,
    ]


def _post_ok(port: int, path: str, body: bytes) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/octet-stream"})
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@dataclass
class ServerProcess(procstat.LoggedServer):
    """A server subprocess whose stdout/stderr go to ``log_path``; stop() ends its whole tree."""

    cmd: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    _log: object = field(default=None, repr=False)

    def start(self) -> None:
        self._log = self.log_path.open("wb")
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_first_answer(self, port: int, path: str, body: bytes, timeout_s: float) -> float:
        """Poll ``POST path`` until it answers 200; return seconds since start. Raises BenchError
        if the server exits or does not answer within ``timeout_s``."""
        assert self.proc is not None
        deadline = self.started_at + timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if _post_ok(port, path, body):
                return time.perf_counter() - self.started_at
            time.sleep(0.01)  # poll interval, not a readiness guess
        raise BenchError(f"no answer from {path} within {timeout_s:.0f} s:\n{self.log_tail()}")


def _children_cpu_s() -> float:
    """CPU seconds of this process's reaped children: wrk's share once it has exited."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_scenario(
    scenario: Scenario, assets: Assets, settings: RunSettings, round_no: int
) -> ScenarioResult:
    """Start the server, time its first answer, warm up, measure, stop. Never raises BenchError:
    a failed run comes back with ``error`` set so the other scenarios still run."""
    run_dir = settings.out_dir / "runs" / f"{scenario.name}-r{round_no}"
    run_dir.mkdir(parents=True, exist_ok=True)
    ports = free_ports(3 if scenario.server == "torchbay" else 1)
    path = f"/predictions/{scenario.model}"
    body_file = assets.body[scenario.model]
    url = f"http://127.0.0.1:{ports[0]}{path}"
    server = ServerProcess(
        server_command(scenario, assets, ports, run_dir, settings.python), run_dir / "server.log"
    )
    try:
        server.start()
        start_s = server.wait_first_answer(
            ports[0], path, body_file.read_bytes(), settings.start_timeout_s
        )
        if settings.warmup_s > 0:
            wrk.run_wrk(
                url, body_file, concurrency=scenario.concurrency, duration_s=settings.warmup_s
            )
        before = procstat.cpu_snapshot(server.pid)
        busy0, client0, wall0 = procstat.system_busy_seconds(), _children_cpu_s(), time.monotonic()
        load = wrk.run_wrk(
            url, body_file, concurrency=scenario.concurrency, duration_s=settings.duration_s
        )
        busy1, client1, wall1 = procstat.system_busy_seconds(), _children_cpu_s(), time.monotonic()
        after = procstat.cpu_snapshot(server.pid)
        memory = procstat.memory_snapshot(server.pid)
    except (BenchError, psutil.NoSuchProcess) as exc:
        return ScenarioResult(scenario.name, round_no, error=str(exc), log=str(server.log_path))
    finally:
        server.stop()
    cpu_s = procstat.cpu_seconds_between(before, after)
    return ScenarioResult(
        scenario=scenario.name,
        round=round_no,
        req_per_s=load.req_per_s,
        p50_ms=load.p50_ms,
        p90_ms=load.p90_ms,
        p99_ms=load.p99_ms,
        requests=load.requests,
        errors=load.errors,
        cpu_ms_per_req=procstat.cpu_ms_per_request(cpu_s, load.requests),
        frontend_rss_mb=memory.frontend_rss_mb,
        tree_rss_mb=memory.tree_rss_mb,
        tree_pss_mb=float("nan") if memory.tree_pss_mb is None else memory.tree_pss_mb,
        processes=memory.processes,
        start_s=start_s,
        foreign_cpu_pct=procstat.foreign_cpu_percent(
            busy1 - busy0, cpu_s, client1 - client0, wall1 - wall0, os.cpu_count() or 1
        ),
        log=str(server.log_path),
    )


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
