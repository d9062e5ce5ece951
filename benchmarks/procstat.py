"""CPU and memory of a server's process tree and of the load generator beside it, by role: the
frontend (the root and every non-worker descendant), the workers, the load generator.

Processes are keyed by (pid, create time): a reused pid is never subtracted from a stranger. A
process born during a run counts all its CPU; children the root reaped count as the frontend's
(one reaped elsewhere loses its last interval: the price of sampling).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from torchbay.benchmarks.cli import REPO_ROOT
from torchbay.benchmarks.loadgen import START_MARGIN_S

ProcKey = tuple[int, float]
FRONTEND, WORKERS, LOAD_GENERATOR = "frontend", "workers", "load generator"
WORKER_MARKS = ("torchbay.server.worker", "model_service_worker")
SPAN = 0.8  # the share of a measured window a CPU window covers, clear of the window's edges


@dataclass(frozen=True)
class CpuSnapshot:
    """Role and CPU seconds (user + system) of each process, and of the root's reaped children."""

    per_process: dict[ProcKey, tuple[str, float]]
    reaped_children_s: float = 0.0


@dataclass(frozen=True)
class MemorySnapshot:
    """Resident and proportional (PSS: shared pages split, torch counted once) memory in MB."""

    frontend_rss_mb: float
    frontend_pss_mb: float | None
    tree_rss_mb: float
    tree_pss_mb: float | None
    processes: int
    largest_child_rss_mb: float = 0.0  # one worker's (or a fork server's template's) own RSS

    @property
    def workers_rss_mb(self) -> float:
        """The resident memory of every process below the root (its workers)."""
        return self.tree_rss_mb - self.frontend_rss_mb


def tree(pid: int) -> list[psutil.Process]:
    """``pid``'s process and all its descendants (the root alone if they cannot be listed)."""
    root = psutil.Process(pid)
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return [root]


def cpu_snapshot(pid: int, generator_pids: Iterable[int] = ()) -> CpuSnapshot:
    """CPU times of ``pid``'s tree and of the load generator's processes now. Raises
    ``psutil.NoSuchProcess`` if the root is gone; other processes that vanish are skipped."""
    per_process: dict[ProcKey, tuple[str, float]] = {}
    reaped = 0.0
    procs = [(proc, None) for proc in tree(pid)]
    for proc, role in procs + [(psutil.Process(p), LOAD_GENERATOR) for p in generator_pids]:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                key = (proc.pid, proc.create_time())
                command = " ".join(proc.cmdline())
                role = role or (WORKERS if any(m in command for m in WORKER_MARKS) else FRONTEND)
        except psutil.Error:
            continue
        per_process[key] = (role, times.user + times.system)
        if proc.pid == pid:
            reaped = times.children_user + times.children_system
    return CpuSnapshot(per_process=per_process, reaped_children_s=reaped)


def cpu_by_role(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """CPU seconds per role between two snapshots (a process born in between counts whole)."""
    used = dict.fromkeys((FRONTEND, WORKERS, LOAD_GENERATOR), 0.0)
    for key, (role, cpu) in after.per_process.items():
        used[role] += cpu - before.per_process.get(key, (role, 0.0))[1]
    used[FRONTEND] += after.reaped_children_s - before.reaped_children_s
    return used


def memory_snapshot(pid: int, with_pss: bool = True) -> MemorySnapshot:
    """RSS/PSS of ``pid`` (the frontend) and of its whole tree. PSS is None where the platform or
    permissions do not give it (it needs /proc/PID/smaps), or without ``with_pss``: reading smaps
    costs the host CPU, too much for a sampler running beside a measured window."""
    sizes: dict[int, tuple[float, float | None]] = {}  # pid: (RSS, PSS) in MB
    for proc in tree(pid):
        try:
            rss = proc.memory_info().rss / 2**20
            try:
                pss = proc.memory_full_info().pss / 2**20 if with_pss else None
            except (psutil.AccessDenied, AttributeError):
                pss = None
        except psutil.NoSuchProcess:  # a zombie too
            continue
        sizes[proc.pid] = (rss, pss)
    root_rss, root_pss = sizes.get(pid, (0.0, None))
    children = [rss for p, (rss, _) in sizes.items() if p != pid]
    every_pss = [pss for _, pss in sizes.values()]
    return MemorySnapshot(
        frontend_rss_mb=root_rss,
        frontend_pss_mb=root_pss,
        tree_rss_mb=root_rss + sum(children),
        tree_pss_mb=None if None in every_pss else sum(p or 0.0 for p in every_pss),
        processes=len(sizes),
        largest_child_rss_mb=max(children, default=0.0),
    )


def machine_info() -> dict[str, Any]:
    """This machine and the versions that matter to the numbers (torch read from package
    metadata, not imported; torchbay with the git commit of this checkout when there is one)."""
    from torchbay import __version__

    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    cmd = ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"]
    git = subprocess.run(cmd, capture_output=True, text=True)
    commit = git.stdout.strip() if git.returncode == 0 else "unknown"
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return {
        "cpu": (models or [platform.processor() or platform.machine()])[0],
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch_version,
        "torchbay": f"{__version__} (git {commit})",
    }


def describe_machine(m: dict[str, Any]) -> str:
    """One line for a report."""
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']:.0f} GiB; {m['os']}; "
        f"Python {m['python']}; torch {m['torch']}; torchbay {m['torchbay']}"
    )


def closed_run_opens(warmup_s: float) -> float:
    """Seconds from a call of ``runner.closed`` to its measured run's start: the warm-up run
    (a start margin, ``warmup_s``, its end), then the measured run's own start margin."""
    return 3 * START_MARGIN_S + warmup_s


class Window:
    """Snapshots taken from a thread ``begin_s`` and ``end_s`` seconds after construction."""

    @classmethod
    def within(cls, pids: tuple[int, Iterable[int]], opens_s: float, duration_s: float) -> Window:
        """``SPAN`` of a measured window of ``duration_s`` that opens ``opens_s`` from now."""
        return cls(*pids, opens_s, opens_s + SPAN * duration_s)

    def __init__(
        self, server_pid: int, generator_pids: Iterable[int], begin_s: float, end_s: float
    ) -> None:
        self._args = (server_pid, list(generator_pids))
        self._t0 = time.monotonic()
        self._marks = (begin_s, end_s)
        self.span_s = end_s - begin_s
        self._snaps: list[CpuSnapshot] = []
        self._thread = threading.Thread(target=self._run, name="cpu-window", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for mark in self._marks:
            time.sleep(max(0.0, self._t0 + mark - time.monotonic()))
            with contextlib.suppress(psutil.Error):  # the server stopped: no window
                self._snaps.append(cpu_snapshot(*self._args))

    def seconds(self) -> dict[str, float] | None:
        """CPU seconds per role inside the window (None if the run ended before it did)."""
        self._thread.join(timeout=max(0.0, self._t0 + self._marks[1] - time.monotonic()) + 5)
        if len(self._snaps) < 2:
            return None
        return cpu_by_role(self._snaps[0], self._snaps[1])


def figures(
    capacity: dict[str, float] | None,
    capacity_ok: float,
    overload: dict[str, float] | None,
    overload_s: float,
    overload_ok: float,
) -> dict[str, float]:
    """Round two's CPU figures from the CPU seconds per role of the window at capacity and of the
    4x phase: the workers' CPU per served request (ms), or a role's share of one core (%); NaN
    where a window was not taken or nothing was served."""

    def per(used: dict[str, float] | None, role: str, by: float, scale: float) -> float:
        return scale * used[role] / by if used is not None and by > 0 else math.nan

    return {
        "worker_ms_capacity": per(capacity, WORKERS, capacity_ok, 1000),
        "worker_ms_4x": per(overload, WORKERS, overload_ok, 1000),
        "cpu_frontend_4x_pct": per(overload, FRONTEND, overload_s, 100),
        "cpu_workers_4x_pct": per(overload, WORKERS, overload_s, 100),
        "cpu_loadgen_4x_pct": per(overload, LOAD_GENERATOR, overload_s, 100),
    }


FIGURES = tuple(figures(None, 0, None, 0, 0))  # the names, in the report's order
