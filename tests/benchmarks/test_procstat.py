from __future__ import annotations

import os
import subprocess
import sys
import time
from subprocess import PIPE

import psutil
import pytest

from torchbay.benchmarks import procstat


def snap(per: dict[tuple[int, float], float], reaped: float = 0.0) -> procstat.CpuSnapshot:
    roles = {key: ("frontend", cpu) for key, cpu in per.items()}
    return procstat.CpuSnapshot(per_process=roles, reaped_children_s=reaped)


def used(before: procstat.CpuSnapshot, after: procstat.CpuSnapshot) -> float:
    """The tree's CPU seconds between two snapshots, every role together."""
    return sum(procstat.cpu_by_role(before, after).values())


def test_cpu_between_counts_new_processes_and_reaped_children() -> None:
    before = snap({(1, 10.0): 2.0, (2, 11.0): 1.0}, reaped=0.5)
    after = snap({(1, 10.0): 3.5, (2, 11.0): 1.25, (3, 12.0): 0.75}, reaped=0.75)
    # root +1.5, worker +0.25, new worker 0.75, reaped +0.25
    assert used(before, after) == pytest.approx(2.75)


def test_reused_pid_is_not_subtracted_from_a_stranger() -> None:
    before = snap({(7, 1.0): 5.0})
    after = snap({(7, 2.0): 0.5})  # same pid, different create time: a new process
    assert used(before, after) == pytest.approx(0.5)


def test_snapshots_of_this_process() -> None:
    before = procstat.cpu_snapshot(os.getpid())
    # Burn CPU until this process has used 50 ms: /proc counts in clock ticks (10 ms), and a
    # fixed loop can finish inside one tick on a fast host (it did: 0.0 > 0 failed).
    started = time.process_time()
    while time.process_time() - started < 0.05:
        sum(i * i for i in range(10_000))
    after = procstat.cpu_snapshot(os.getpid())
    assert used(before, after) > 0
    memory = procstat.memory_snapshot(os.getpid())
    assert memory.processes >= 1
    assert memory.tree_rss_mb >= memory.frontend_rss_mb > 1
    if memory.frontend_pss_mb is not None:
        assert 0 < memory.frontend_pss_mb <= memory.frontend_rss_mb


def test_workers_rss_counts_the_children_and_skips_pss_when_asked() -> None:
    program = "import sys; print('up', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", program], stdin=PIPE, stdout=PIPE)
    try:
        # Its interpreter started (not a process that has just exec'd, under 1 MB resident).
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        memory = procstat.memory_snapshot(os.getpid(), with_pss=False)
        assert memory.processes >= 2
        assert memory.frontend_pss_mb is None and memory.tree_pss_mb is None
        child_rss = psutil.Process(child.pid).memory_info().rss / 2**20
        assert memory.workers_rss_mb >= memory.largest_child_rss_mb >= child_rss * 0.9 > 1
    finally:
        child.communicate(b"")
