"""A ``torchbay bench run --archive`` stopped in the middle (SIGTERM from a CI timeout): the
server it started stops with it and its temporary run folder goes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.timeout(180)


def _bench_under_load(tiny: tuple[Path, Path]) -> tuple[subprocess.Popen, psutil.Process]:
    """A long closed-loop bench of the tiny archive, returned once its load runs (its first
    progress line), with the server it started."""
    cmd = [sys.executable, "-m", "torchbay", "bench", "run", "--archive", str(tiny[0])]
    cmd += ["--input", str(tiny[1]), "-c", "1", "--duration", "120", "--warmup", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    while "answered" not in (line := proc.stderr.readline()):
        assert line, f"the bench ended before its load: {proc.wait()}"
    (server,) = (p for p in psutil.Process(proc.pid).children() if "serve" in p.cmdline())
    return proc, server


def test_sigterm_stops_the_server_it_started(tiny: tuple[Path, Path]) -> None:
    """SIGTERM killed the bench at once: its server (and workers) went on running, orphaned,
    and its tb-bench-* folder stayed in /tmp. It stops as Ctrl-C does now."""
    proc, server = _bench_under_load(tiny)
    run_dir, tree = Path(server.cwd()), [server, *server.children(recursive=True)]
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 130
        alive = psutil.wait_procs(tree, timeout=30)[1]
        assert not alive and not run_dir.exists()
    finally:
        for p in tree:  # an orphan of a failed run
            if p.is_running():
                p.kill()
        proc.kill()
        proc.communicate()
