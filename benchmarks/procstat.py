"""CPU and memory of a server's process tree (the process and all its descendants).

CPU: take :func:`cpu_snapshot` before and after a load run; :func:`cpu_seconds_between` gives the
tree's CPU seconds spent in between and :func:`cpu_ms_per_request` divides by the requests served.
Processes are keyed by (pid, create time) so a reused pid is never subtracted from a stranger; a
process born during the run counts all its CPU; children that exited and were reaped by the root
count through the root's ``children_user``/``children_system``. (A child that dies unreaped, or is
reaped by a grandparent, loses its last interval: the price of sampling, noted for workers that
crash mid-run.)

Memory: :func:`memory_snapshot` gives RSS and PSS (proportional set size: shared pages split
between the processes sharing them, so the tree's PSS does not count torch's libraries once per
worker) of the root ("frontend") and of the whole tree.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

_MB = 1024 * 1024
ProcKey = tuple[int, float]


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds (user + system) of each live process of a tree, and of its reaped children."""

    per_process: dict[ProcKey, float]
    reaped_children_s: float

    @property
    def total_s(self) -> float:
        return sum(self.per_process.values()) + self.reaped_children_s


@dataclass(frozen=True)
class MemorySnapshot:
    """Resident and proportional memory in MB of the root process and of the whole tree."""

    frontend_rss_mb: float
    frontend_pss_mb: float | None
    tree_rss_mb: float
    tree_pss_mb: float | None
    processes: int


def tree(pid: int) -> list[psutil.Process]:
    """``pid``'s process and all its descendants (the root alone if they cannot be listed)."""
    root = psutil.Process(pid)
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return [root]


def cpu_snapshot(pid: int) -> CpuSnapshot:
    """CPU times of ``pid`` and its descendants now. Raises ``psutil.NoSuchProcess`` if the root is
    gone; descendants that vanish while being read are skipped."""
    per_process: dict[ProcKey, float] = {}
    reaped = 0.0
    for proc in tree(pid):
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                key = (proc.pid, proc.create_time())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        per_process[key] = times.user + times.system
        if proc.pid == pid:
            reaped = times.children_user + times.children_system
    return CpuSnapshot(per_process=per_process, reaped_children_s=reaped)


def cpu_seconds_between(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """CPU seconds the tree spent between two snapshots (never negative)."""
    spent = sum(cpu - before.per_process.get(key, 0.0) for key, cpu in after.per_process.items())
    spent += after.reaped_children_s - before.reaped_children_s
    return max(spent, 0.0)


def cpu_ms_per_request(cpu_seconds: float, requests: int) -> float:
    """Server CPU milliseconds per request; NaN when no request was served."""
    if requests <= 0:
        return float("nan")
    return cpu_seconds * 1000.0 / requests


def memory_snapshot(pid: int) -> MemorySnapshot:
    """RSS/PSS of ``pid`` (the frontend) and of its whole tree. PSS is None where the platform or
    permissions do not give it (it needs /proc/PID/smaps)."""
    frontend_rss = 0
    frontend_pss: int | None = None
    tree_rss = 0
    tree_pss: int | None = 0
    count = 0
    for proc in tree(pid):
        try:
            rss = proc.memory_info().rss
            try:
                pss: int | None = proc.memory_full_info().pss
            except (psutil.AccessDenied, AttributeError):
                pss = None
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        count += 1
        tree_rss += rss
        tree_pss = None if tree_pss is None or pss is None else tree_pss + pss
        if proc.pid == pid:
            frontend_rss, frontend_pss = rss, pss
    return MemorySnapshot(
        frontend_rss_mb=frontend_rss / _MB,
        frontend_pss_mb=None if frontend_pss is None else frontend_pss / _MB,
        tree_rss_mb=tree_rss / _MB,
        tree_pss_mb=None if tree_pss is None else tree_pss / _MB,
        processes=count,
    )


def system_busy_seconds() -> float:
    """CPU seconds all cores of the machine spent not idle since boot (idle and iowait excluded)."""
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def foreign_cpu_percent(
    busy_s: float, server_s: float, client_s: float, wall_s: float, cores: int
) -> float:
    """Share of the machine's capacity (``wall_s * cores``) used by processes that are neither the
    server nor the load generator during a run: a noise flag for shared machines (0 when quiet)."""
    if wall_s <= 0 or cores <= 0:
        return float("nan")
    return max(busy_s - server_s - client_s, 0.0) / (wall_s * cores) * 100.0


def stop_tree(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM ``proc``, wait ``grace_s``, then kill it and any descendant left behind."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _gone, alive = psutil.wait_procs(tree, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a server's log file (empty if it has none)."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


class LoggedServer:
    """Mixin for a server subprocess whose output goes to ``log_path`` (the subclass provides
    ``proc``, ``log_path`` and the open log file ``_log``)."""

    proc: subprocess.Popen | None
    log_path: Path
    _log: Any

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server, wait ``grace_s``, then kill it and any descendant left behind."""
        if self.proc is not None:
            stop_tree(self.proc, grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """This machine and the versions that matter to the numbers (torch read from package
    metadata, not imported; torchbay with the git commit of this checkout when there is one)."""
    from torchbay import __version__

    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    repo = Path(__file__).resolve().parent.parent
    git = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    commit = git.stdout.strip() if git.returncode == 0 else "unknown"
    return {
        "cpu": _cpu_model(),
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
