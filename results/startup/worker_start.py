"""A new worker's start, spawned against forked (issue 31, item 1), side by side in one run.

    .venv/bin/python results/startup/worker_start.py --runs 3 --kills 2 --out results/startup

Each run starts a ``TorchbayServer`` in this process (the ``tiny`` archive; spawn and fork
alternating run by run) and times every new worker from the decision (its slot's new
``WorkerProcess``) to its ``Ready``, the model's own load (``load_time_ms``) apart, and the spawn
call (``Popen``; for a fork, the round trip to the template), for a scale-up 1 -> 3 and for a
restart after ``kill -9`` (``--kills`` times). Fork mode waits for the template first (it starts
once, as slowly as a spawned worker). Figures are medians of the runs' medians. Writes
``worker-start.md`` and ``worker-start.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from torchbay.benchmarks import runner
from torchbay.benchmarks.procstat import describe_machine, machine_info
from torchbay.benchmarks.report import markdown_table, median
from torchbay.server.config.settings import ServerConfig
from torchbay.server.observe.oip_stats import Observers
from torchbay.server.serve import TorchbayServer
from torchbay.server.serving.model import Observer

MODES = ("spawn", "fork")
READY_TIMEOUT_S = 120.0


@dataclass
class Start:
    """One worker's start: decision -> Ready, of which the model's load."""

    mode: str
    kind: str  # "scale-up" or "restart"
    ready_ms: float
    load_ms: float
    forked: bool
    run: int = 0
    spawn_call_ms: float = 0.0  # of ready_ms: the spawn function's call (fork: a round trip)

    @property
    def before_load_ms(self) -> float:
        return self.ready_ms - self.load_ms


class _Recorder(Observer):
    """Notes every worker start as the slot reports it (right after its Ready)."""

    def __init__(self, mode: str, run: int) -> None:
        self.mode, self.run = mode, run
        self.starts: list[Start] = []
        self.changed = threading.Condition()

    def worker_started(self, model: Any, worker: Any, restart: bool) -> None:
        ready_ms = (time.time() - worker.start_time) * 1000
        forked = not isinstance(worker._proc, subprocess.Popen)
        kind = "restart" if restart else "scale-up"
        call_ms = getattr(worker._proc, "spawn_call_ms", 0.0)
        start = Start(self.mode, kind, ready_ms, worker.load_time_ms, forked, self.run, call_ms)
        with self.changed:
            self.starts.append(start)
            self.changed.notify_all()

    def wait_for(self, count: int) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.starts) >= count, READY_TIMEOUT_S):
                raise RuntimeError(f"{count} worker starts not seen in {READY_TIMEOUT_S:g}s")


@contextlib.contextmanager
def serving(store: Path, mode: str) -> Iterator[TorchbayServer]:
    """A TorchbayServer on its own loop in a thread (as the tests' LiveServer), ports 0."""
    config = ServerConfig.model_validate(
        {
            "model_store": store,
            "load_models": ["tiny=tiny.mar"],
            "inference_address": "http://127.0.0.1:0",
            "management_address": "http://127.0.0.1:0",
            "metrics_address": "http://127.0.0.1:0",
            "grpc_inference_port": 0,
            "grpc_management_port": 0,
            "disable_token_authorization": True,
            "worker_start": mode,
        }
    )
    server = TorchbayServer(config, env=dict(os.environ))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()))
    thread.start()
    try:
        if not server.state.started.wait(READY_TIMEOUT_S):
            raise RuntimeError("the server did not start")
        yield server
    finally:
        server.request_stop()
        thread.join(READY_TIMEOUT_S)


def _timed(spawn: Any) -> Any:
    """``spawn``, noting on each process handle how long its call took."""

    def timed(*args: Any) -> Any:
        started = time.perf_counter()
        spawned = spawn(*args)
        spawned.proc.spawn_call_ms = (time.perf_counter() - started) * 1000
        return spawned

    return timed


def one_run(store: Path, mode: str, kills: int, run: int) -> list[Start]:
    """Scale 1 -> 3, then kill -9 a worker ``kills`` times; every new worker's start."""
    with serving(store, mode) as server:
        if server.forks is not None and not server.forks.wait_ready(READY_TIMEOUT_S):
            raise RuntimeError("the worker template did not start")
        recorder = _Recorder(mode, run)
        assert server.registry is not None
        [mv] = server.registry.all_versions()
        mv.observer = Observers(mv.observer, recorder)
        mv.spawn = _timed(mv.spawn)
        scaled = httpx.put(
            f"http://127.0.0.1:{server.state.ports.management}/models/tiny",
            params={"min_worker": 3, "max_worker": 3, "synchronous": "true"},
            timeout=READY_TIMEOUT_S,
        )
        scaled.raise_for_status()
        recorder.wait_for(2)
        for k in range(kills):
            os.kill(mv.slots[k % len(mv.slots)].worker.pid, signal.SIGKILL)
            recorder.wait_for(3 + k)
        return recorder.starts


KEYS = ("ready_ms", "load_ms", "before_load_ms", "spawn_call_ms")


def _medians(rows: list[Any], get: Any) -> dict[str, float]:
    return {key: round(median([get(row, key) for row in rows]), 1) for key in KEYS}


def summarize(starts: list[Start], runs: int) -> dict[str, Any]:
    """Per mode and kind: the median of the runs' medians, and each run's median."""
    summary: dict[str, Any] = {}
    for mode, kind in itertools.product(MODES, ("scale-up", "restart")):
        per_run = []
        for run in range(runs):
            if mine := [s for s in starts if (s.mode, s.kind, s.run) == (mode, kind, run)]:
                forked = all(s.forked for s in mine)
                per_run.append({**_medians(mine, getattr), "forked": forked})
        summary[f"{mode} {kind}"] = {"runs": per_run, **_medians(per_run, dict.__getitem__)}
    return summary


COLUMNS = (
    "start",
    "decision -> READY ms (median)",
    "model load ms",
    "before the load ms",
    "of which the spawn call ms",
    "every run (decision -> READY / before the load)",
)


def render(summary: dict[str, Any], command: str, when: str) -> str:
    """The report: the command, when and where it ran, and one table row per mode and kind."""
    rows = []
    for name, row in summary.items():
        every = ", ".join(f"{r['ready_ms']:g} / {r['before_load_ms']:g}" for r in row["runs"])
        rows.append([name, *(f"{row[key]:g}" for key in KEYS), every])
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    machine = f"{describe_machine(machine_info())}; load average {load}"
    head = "## A new worker's start: spawned and forked (issue 31, item 1)"
    lines = [head, "", f"Command: `{command}`  ", f"When: {when}  ", f"Machine: {machine}", ""]
    return "\n".join(lines) + markdown_table(COLUMNS, rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/startup"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="torchbay-worker-start-") as work:
        assets = runner.prepare_models(Path(work))
        store = Path(work) / "model_store"
        store.mkdir()
        runner.archive("tiny", assets.pt["tiny"], store, sys.executable)
        starts: list[Start] = []
        for run in range(args.runs):
            for mode in MODES:  # alternating: the host's load weighs on both alike
                starts += one_run(store, mode, args.kills, run)
                print(f"run {run + 1}/{args.runs} {mode}: done", file=sys.stderr)
    summary = summarize(starts, args.runs)
    command = "python results/startup/worker_start.py " + " ".join(argv or sys.argv[1:])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report = render(summary, command.strip(), when)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "worker-start.md").write_text(report)
    raw = {"summary": summary, "starts": [asdict(s) for s in starts]}
    (args.out / "worker-start.json").write_text(json.dumps(raw, indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
