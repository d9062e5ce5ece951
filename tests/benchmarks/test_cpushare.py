"""benchmarks/procstat.py: who used the CPU in a window (frontend, workers, load generator)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from torchbay.benchmarks import procstat
from torchbay.benchmarks.procstat import CpuSnapshot

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_cpu_seconds_by_role() -> None:
    before = {(1, 1.0): ("frontend", 2.0), (2, 1.0): ("workers", 5.0), (7, 1.0): ("workers", 9.0)}
    after = {
        (1, 1.0): ("frontend", 2.5),
        (2, 1.0): ("workers", 6.0),
        (3, 2.0): ("workers", 0.25),  # born in between: counted whole
        (7, 3.0): ("workers", 0.5),  # the same pid, another process: not a stranger's delta
        (9, 1.0): ("load generator", 1.0),
    }
    used = procstat.cpu_by_role(CpuSnapshot(before), CpuSnapshot(after))
    assert used == pytest.approx({"frontend": 0.5, "workers": 1.75, "load generator": 1.0})


def test_figures() -> None:
    at_capacity = {"frontend": 1.0, "workers": 16.0, "load generator": 0.5}
    overload = {"frontend": 3.0, "workers": 14.0, "load generator": 1.5}
    got = procstat.figures(at_capacity, 5000, overload, 10.0, 4000)
    assert set(got) == set(procstat.FIGURES)
    assert got["worker_ms_capacity"] == pytest.approx(3.2)
    assert got["worker_ms_4x"] == pytest.approx(3.5)
    assert got["cpu_frontend_4x_pct"] == pytest.approx(30.0)
    assert got["cpu_workers_4x_pct"] == pytest.approx(140.0)
    assert got["cpu_loadgen_4x_pct"] == pytest.approx(15.0)
    missed = procstat.figures(at_capacity, 0, None, 10.0, 0)
    assert all(math.isnan(v) for v in missed.values())


def test_a_real_tree_in_a_window() -> None:
    """This process is the "frontend", a child whose command line names a worker module is a
    worker, another process is the load generator; each burns CPU inside the window."""
    worker = subprocess.Popen([sys.executable, "-c", BURN.format(s=5), "torchbay.server.worker"])
    generator = subprocess.Popen([sys.executable, "-c", BURN.format(s=5)])
    try:
        window = procstat.Window(os.getpid(), [generator.pid], 0.2, 1.2)
        used = window.seconds()
        assert used is not None  # both burn for longer than the window lasts
        # About 1 s each on 2 cores when the host is quiet; on a host loaded 10 deep each still
        # gets ~0.15 s of the 1 s window. 5 ticks (/proc counts 10 ms) tell burning from idle.
        assert used["workers"] >= 0.05
        assert used["load generator"] >= 0.05  # counted once, although a child of the "frontend"
        assert used["frontend"] < 0.2
    finally:
        for proc in (worker, generator):
            proc.kill()
            proc.wait()
