"""A new worker's start, spawned against forked (issue 31, item 1), side by side in one run.

    python results/startup/worker_start.py [--runs 3] [--kills 2] [--out results/startup]

Each run starts a real server in this process (``TorchbayServer`` on 127.0.0.1 port 0, the
``tiny`` reference archive, ``worker_start`` spawn or fork, the two modes alternating run by run)
and times, for every new worker, the decision (the ``WorkerProcess`` made by its slot: the scale
request's new slot, or the supervisor's restart after a death) to its ``Ready``, with the model's
own load (the worker's ``load_time_ms``: ``load_service``) shown apart, and of the time before
it, the spawn function's own call (``Popen``; for a fork, the round trip to the template):

* scale-up: ``PUT /models/tiny?min_worker=3`` from one worker (two new workers);
* restart: ``kill -9`` of a worker, ``--kills`` times, one at a time (restart back-off 0).

In fork mode each run first waits for the worker template to be up (its own start is as slow as
a spawned worker's, and happens once, after the start-up models). Figures are medians of the runs'
medians; every run's median is kept. Writes ``worker-start.md`` and ``worker-start.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
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


class _Server:
    """A TorchbayServer on its own loop in a thread (as the tests' LiveServer)."""

    def __init__(self, store: Path, mode: str) -> None:
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
        self.server = TorchbayServer(config, env=dict(os.environ))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()))
        self.thread.start()
        if not self.server.state.started.wait(READY_TIMEOUT_S):
            raise RuntimeError("the server did not start")

    @property
    def management(self) -> str:
        return f"http://127.0.0.1:{self.server.state.ports.management}"

    def version(self) -> Any:
        assert self.server.registry is not None
        [mv] = self.server.registry.all_versions()
        return mv

    def stop(self) -> None:
        self.server.request_stop()
        self.thread.join(READY_TIMEOUT_S)


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
    server = _Server(store, mode)
    try:
        forks = server.server.forks
        if forks is not None and not forks.wait_ready(READY_TIMEOUT_S):
            raise RuntimeError("the worker template did not start")
        recorder = _Recorder(mode, run)
        mv = server.version()
        mv.observer = Observers(mv.observer, recorder)
        mv.spawn = _timed(mv.spawn)
        scaled = httpx.put(
            f"{server.management}/models/tiny",
            params={"min_worker": 3, "max_worker": 3, "synchronous": "true"},
            timeout=READY_TIMEOUT_S,
        )
        scaled.raise_for_status()
        recorder.wait_for(2)
        for k in range(kills):
            victim = mv.slots[k % len(mv.slots)].worker
            os.kill(victim.pid, signal.SIGKILL)
            recorder.wait_for(3 + k)
        return recorder.starts
    finally:
        server.stop()


def _median(values: list[float]) -> float:
    return round(median(values), 1)


def summarize(starts: list[Start], runs: int) -> dict[str, Any]:
    """Per mode and kind: the median of the runs' medians, and each run's median."""
    summary: dict[str, Any] = {}
    for mode in MODES:
        for kind in ("scale-up", "restart"):
            per_run = []
            for run in range(runs):
                mine = [s for s in starts if (s.mode, s.kind, s.run) == (mode, kind, run)]
                if mine:
                    per_run.append(
                        {
                            "ready_ms": _median([s.ready_ms for s in mine]),
                            "load_ms": _median([s.load_ms for s in mine]),
                            "before_load_ms": _median([s.before_load_ms for s in mine]),
                            "spawn_call_ms": _median([s.spawn_call_ms for s in mine]),
                            "forked": all(s.forked for s in mine),
                        }
                    )
            summary[f"{mode} {kind}"] = {
                "runs": per_run,
                **{
                    key: _median([r[key] for r in per_run])
                    for key in ("ready_ms", "load_ms", "before_load_ms", "spawn_call_ms")
                },
            }
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
        keys = ("ready_ms", "load_ms", "before_load_ms", "spawn_call_ms")
        rows.append([name, *(f"{row[key]:g}" for key in keys), every])
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    machine = f"{describe_machine(machine_info())}; load average {load}"
    head = "## A new worker's start: spawned and forked (issue 31, item 1)"
    lines = [head, "", f"Command: `{command}`  ", f"When: {when}  ", f"Machine: {machine}", ""]
    return "\n".join(lines) + markdown_table(COLUMNS, rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python results/startup/worker_start.py", description=__doc__.splitlines()[0]
    )
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
