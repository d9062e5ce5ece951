"""Who used the CPU in a window of a load run: a server's frontend (its root process and every
descendant that is not a worker: TorchServe's java frontend counts here) and its workers
(torchbay's ``torchbay.server.worker`` or TorchServe's ``model_service_worker`` processes), and
the load generator's processes. Round two's overload row reports them, so that a missed goodput
target says where the two cores went, for both servers.

    before = snapshot(server_pid, generator_pids)
    ...  # the load
    used = cpu_seconds(before, snapshot(server_pid, generator_pids))  # role -> CPU seconds

:class:`Window` takes the two snapshots from a thread at given offsets (a phase inside one run).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable

import psutil

from torchbay.benchmarks import procstat
from torchbay.benchmarks.loadgen import START_MARGIN_S

FRONTEND, WORKERS, LOAD_GENERATOR = "frontend", "workers", "load generator"
WORKER_MARKS = ("torchbay.server.worker", "model_service_worker")
# The figures of :func:`figures`, as round two's overload row reports them.
FIGURES = (
    "worker_ms_capacity",
    "worker_ms_4x",
    "cpu_frontend_4x_pct",
    "cpu_workers_4x_pct",
    "cpu_loadgen_4x_pct",
)
SPAN = 0.8  # the share of a measured window a CPU window covers, clear of the window's edges
Snapshot = dict[tuple[int, float], tuple[str, float]]  # (pid, create time) -> (role, CPU s)


def is_worker(proc: psutil.Process) -> bool:
    """A worker process of torchbay or TorchServe (by its command line)."""
    command = " ".join(proc.cmdline())
    return any(mark in command for mark in WORKER_MARKS)


def snapshot(server_pid: int, generator_pids: Iterable[int]) -> Snapshot:
    """Each live process's role and CPU seconds (user + system) so far."""
    out: Snapshot = {}
    with contextlib.suppress(psutil.Error):
        server = [(proc, None) for proc in procstat.tree(server_pid)]
        procs = server + [(psutil.Process(pid), LOAD_GENERATOR) for pid in generator_pids]
        for proc, role in procs:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                key = (proc.pid, proc.create_time())
                role = role or (WORKERS if is_worker(proc) else FRONTEND)
                out[key] = (role, times.user + times.system)
    return out


def cpu_seconds(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per role between two snapshots (a process born in between counts whole)."""
    used = dict.fromkeys((FRONTEND, WORKERS, LOAD_GENERATOR), 0.0)
    for key, (role, cpu) in after.items():
        used[role] += cpu - before.get(key, (role, 0.0))[1]
    return used


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

    @property
    def span_s(self) -> float:
        return self._marks[1] - self._marks[0]

    def __init__(
        self, server_pid: int, generator_pids: Iterable[int], begin_s: float, end_s: float
    ) -> None:
        self._args = (server_pid, list(generator_pids))
        self._t0 = time.monotonic()
        self._marks = (begin_s, end_s)
        self._snaps: list[Snapshot] = []
        self._thread = threading.Thread(target=self._run, name="cpushare", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for mark in self._marks:
            time.sleep(max(0.0, self._t0 + mark - time.monotonic()))
            self._snaps.append(snapshot(*self._args))

    def seconds(self) -> dict[str, float] | None:
        """CPU seconds per role inside the window (None if the run ended before it did)."""
        self._thread.join(timeout=max(0.0, self._t0 + self._marks[1] - time.monotonic()) + 5)
        if len(self._snaps) < 2:
            return None
        return cpu_seconds(self._snaps[0], self._snaps[1])


def figures(
    capacity: dict[str, float] | None,
    capacity_ok: float,
    overload: dict[str, float] | None,
    overload_s: float,
    overload_ok: float,
) -> dict[str, float]:
    """Round two's CPU figures: the workers' CPU per served request at capacity and in the 4x
    phase (ms), and each role's share of one core in the 4x phase (%); NaN where a window was
    not taken."""
    nan = float("nan")
    out = {"worker_ms_capacity": nan}
    if capacity is not None and capacity_ok:
        out["worker_ms_capacity"] = 1000 * capacity[WORKERS] / capacity_ok
    keys = ("cpu_frontend_4x_pct", "cpu_workers_4x_pct", "cpu_loadgen_4x_pct", "worker_ms_4x")
    out.update(dict.fromkeys(keys, nan))
    if overload is not None and overload_s > 0:
        for key, role in zip(keys, (FRONTEND, WORKERS, LOAD_GENERATOR), strict=False):
            out[key] = 100 * overload[role] / overload_s
        if overload_ok:
            out["worker_ms_4x"] = 1000 * overload[WORKERS] / overload_ok
    return out
