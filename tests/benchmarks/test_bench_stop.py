"""A ``torchbay bench run --archive`` stopped in the middle (Ctrl-C, SIGTERM from a CI timeout):
the server it started stops with it and its temporary run folder goes; Ctrl-C prints the report
of the part measured, saying that it is partial."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.timeout(180)


def _bench_under_load(
    tiny: tuple[Path, Path], **popen: object
) -> tuple[subprocess.Popen, psutil.Process]:
    """A long closed-loop bench of the tiny archive, returned once its load runs (its first
    progress line), with the server it started."""
    cmd = [sys.executable, "-m", "torchbay", "bench", "run", "--archive", str(tiny[0])]
    cmd += ["--input", str(tiny[1]), "-c", "1", "--duration", "120", "--warmup", "0"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen(cmd, **pipes, **popen)  # type: ignore[call-overload]
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


def test_ctrl_c_prints_a_partial_report_and_stops_the_server(tiny: tuple[Path, Path]) -> None:
    """Ctrl-C (SIGINT to the job's process group): the bench printed nothing and exited 130, its
    generator process a KeyboardInterrupt traceback, and the server (in the same group) shut
    down under the load. Now the load halts, the part measured is reported as partial, with
    no error of that stop, and the server is stopped after."""
    proc, server = _bench_under_load(tiny, process_group=0)  # a foreground job
    run_dir, tree = Path(server.cwd()), [server, *server.children(recursive=True)]
    try:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "note: interrupted: a partial run, " in out and "Traceback" not in err, err
        assert re.search(r"requests +([1-9][\d,]*) sent, \1 ok, 0 errors", out), out
        assert "settings: {'batchSize': 1" in out  # the server answered until the report
        assert not psutil.wait_procs(tree, timeout=30)[1] and not run_dir.exists()
    finally:
        for p in tree:
            if p.is_running():
                p.kill()
        proc.kill()
        proc.communicate()
