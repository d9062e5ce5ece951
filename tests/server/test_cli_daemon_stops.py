"""``torchbay serve --start`` when the start does not go to its end: the server stopped while it
starts (``--stop``, a signal), the ``--start`` process itself interrupted or its stdout closed,
Ctrl-C while the command starts. The real command, a real server in the background; a start is
held where the test acts (a model whose load waits on a gate, a process held in an import:
cli_helpers.hold_import), never timed."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from torchbay.server import daemon
from torchbay.server.serve import stop_bound

from .cli_helpers import (
    PID_FILE,
    clean_env,
    free_addresses,
    hold_import,
    kill_tree,
    read_ready,
    torchbay,
    wait_for,
    wait_gone,
)
from .conftest import load_gated_store

pytestmark = pytest.mark.slow


def _start(cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "torchbay", "serve", "--start", "--ncs", "--dt", *args]
    command += free_addresses()
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    return subprocess.Popen(command, cwd=cwd, env=env, text=True, **pipes)


def _gated_start(
    cli_run: tuple[Path, dict[str, str]],
    factory: pytest.TempPathFactory,
    tmp_path: Path,
    prefix: str,
) -> tuple[Path, Callable[[], bool], Path, subprocess.Popen]:
    """--start of a model whose load waits for ``tmp_path/gate``, ``--ready-file`` ready.json in
    its folder: (the gate, whether the load has begun, the ready file, the --start process)."""
    cwd, env = cli_run
    gate = tmp_path / "gate"
    store, load_started = load_gated_store(factory, tmp_path, prefix, gate=gate)
    ready = cwd / "ready.json"
    models = ("--models", "gated=gated.mar", "--ready-file", str(ready))
    return gate, load_started, ready, _start(cwd, env, "--model-store", str(store), *models)


def _stop(cwd: Path, env: dict[str, str]) -> None:
    stopped = torchbay(cwd, env, "serve", "--stop")
    assert (stopped.returncode, stopped.stdout) == (0, "torchbay has stopped.\n")


def _while_starting(
    starting: subprocess.Popen, started: Callable[[], bool], env: dict[str, str], act: Callable
) -> tuple[int, str, str]:
    """Once ``started`` holds (the server starting, its pid file written), ``act()``, then the
    end of --start (killed if it outlives the test): (the server's pid, --start's stdout, its
    stderr)."""
    try:
        wait_for(started, starting)
        pid = int((Path(env["TMPDIR"]) / PID_FILE).read_text())
        act()
        out, err = starting.communicate(timeout=60)
    finally:
        if starting.poll() is None:
            starting.kill()
        if not starting.stdout.closed:  # (communicate closes its pipes: none left to a later gc)
            starting.communicate()
    return pid, out, err


def test_a_stop_while_the_models_load_is_a_start_that_failed(cli_run, tmp_path_factory, tmp_path):
    """--stop while the start-up models still load: the server stops (without waiting for
    them), and --start says it was stopped before it was ready, exit 1 (it exited 1 with
    nothing said)."""
    cwd, env = cli_run
    store, load_started = load_gated_store(tmp_path_factory, tmp_path, "stop-starting")
    starting = _start(cwd, env, "--model-store", str(store), "--models", "gated=gated.mar")
    pid, out, err = _while_starting(starting, load_started, env, lambda: _stop(cwd, env))
    assert starting.returncode == 1, (out, err)
    assert err.splitlines() == [
        f"torchbay: error: the server (pid {pid}) was stopped before it was ready"
    ]
    assert "stop asked during start-up" in out  # its console, relayed until it stopped
    assert not (Path(env["TMPDIR"]) / PID_FILE).exists()


def test_a_stop_before_the_server_owns_its_signals(cli_run, talk_store, tmp_path):
    """--stop while the server is still reading its configuration (held in an import): a clean
    stop there (server/early_stop.py), and --start says the server was stopped before it was
    ready, exit 1 (it exited 241: sys.exit(-15); then "stopped by SIGTERM": killed by it)."""
    cwd, env = cli_run
    hold, held = hold_import(tmp_path, "torchbay.server.config.sources")
    env = {**env, **hold}
    starting = _start(cwd, env, "--model-store", str(talk_store))
    pid, out, err = _while_starting(starting, held, env, lambda: _stop(cwd, env))
    assert starting.returncode == 1, (out, err)
    assert err.splitlines() == [
        f"torchbay: error: the server (pid {pid}) was stopped before it was ready"
    ]
    assert not (Path(env["TMPDIR"]) / PID_FILE).exists()


def test_an_interrupted_start_leaves_the_server_starting(cli_run, tmp_path_factory, tmp_path):
    """Ctrl-C (or a closed terminal) ends --start while the models load: the server goes on in
    the background, serves once up, and --stop stops it. It died as it became ready (exit 1):
    its console, the pipe to the --start process that was gone, raised BrokenPipeError when
    the server let go of it."""
    cwd, env = cli_run
    gate, load_started, ready, starting = _gated_start(
        cli_run, tmp_path_factory, tmp_path, "int-start"
    )
    interrupt = functools.partial(starting.send_signal, signal.SIGINT)
    pid, _, err = _while_starting(starting, load_started, env, interrupt)
    assert starting.returncode == 130
    assert err.splitlines() == [  # it said nothing: was the start given up?
        f"torchbay: interrupted: the server (pid {pid}) goes on starting in the background; "
        "torchbay serve --stop stops it"
    ]
    gate.touch()
    deadline = time.monotonic() + 100
    while not ready.exists():
        assert psutil.pid_exists(pid) and time.monotonic() < deadline
        time.sleep(0.05)
    info = read_ready(ready)
    assert (info["pid"], info["failed_models"]) == (pid, {})
    assert httpx.get(f"http://127.0.0.1:{info['inference']}/ping", timeout=30).status_code == 200
    _stop(cwd, env)
    server_log = (cwd / "logs" / "ts_log.log").read_text()
    assert "Traceback" not in server_log and "BrokenPipeError" not in server_log


def test_ctrl_c_during_the_commands_imports_is_no_traceback(tmp_path, talk_store):
    """Ctrl-C while ``torchbay serve`` still imports its verbs (held there): exit 130, nothing
    on stderr, the early worker it spawned gone. It printed a KeyboardInterrupt traceback and
    died of SIGINT (-2)."""
    hold, held = hold_import(tmp_path, "torchbay.archiver.cli")
    env = clean_env(tmp_path / "tmp", **hold)
    command = [sys.executable, "-m", "torchbay", "serve", "--foreground", "--ncs"]
    command += ["--model-store", str(talk_store), "--models", "talk=talk.mar", *free_addresses()]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, text=True, **pipes)
    try:
        wait_for(held, proc)
        early = psutil.Process(proc.pid).children()  # the worker spawned before the imports
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        kill_tree(proc.pid)
        proc.communicate()
    assert (proc.returncode, out, err) == (130, "", "")
    assert early and all(wait_gone(child.pid, timeout=30) for child in early)


def test_a_start_whose_stdout_closes_still_waits_for_ready(cli_run, tmp_path_factory, tmp_path):
    """``torchbay serve --start ... | grep -m1 ready``: the reader of --start's stdout is gone
    before the server is up (closed here while the model loads). --start still waits for the
    server and exits 0, without a traceback; it raised BrokenPipeError (exit 1)."""
    gate, load_started, ready, starting = _gated_start(
        cli_run, tmp_path_factory, tmp_path, "pipe-start"
    )
    assert starting.stdout is not None and starting.stderr is not None
    try:
        wait_for(load_started, starting)
        starting.stdout.close()  # what the server logs from now on meets a closed pipe
        gate.touch()
        err = starting.stderr.read()
        starting.wait(timeout=100)
    finally:
        if starting.poll() is None:
            starting.kill()
        starting.wait()
        starting.stderr.close()
    assert (starting.returncode, err) == (0, "")
    info = read_ready(ready)
    assert httpx.get(f"http://127.0.0.1:{info['inference']}/ping", timeout=30).status_code == 200


def test_stop_waits_as_long_as_the_servers_own_stop_bound(cli_run, talk_store, monkeypatch):
    """A server with shutdown_grace_s 400 may take stop_bound(400) = 413 s to stop; --stop gave
    up after a fixed 300 s ("did not stop", exit 1, the pid file left) while it still drained.
    The server records its grace beside the pid file, and --stop waits its bound plus
    STOP_MARGIN_S; the record goes with the server."""
    cwd, env = cli_run
    env = {**env, "TORCHBAY_SHUTDOWN_GRACE_S": "400"}
    ready = cwd / "ready.json"
    args = ["serve", "--start", "--ncs", "--dt", "--model-store", str(talk_store)]
    started = torchbay(cwd, env, *args, "--ready-file", str(ready), *free_addresses())
    assert started.returncode == 0, started.stderr
    pid = read_ready(ready)["pid"]
    monkeypatch.setattr(tempfile, "tempdir", env["TMPDIR"])  # daemon's pid file: the server's
    grace = daemon.recorded_grace(pid)
    assert grace == 400.0
    assert daemon.stop_wait(grace) == stop_bound(400.0) + daemon.STOP_MARGIN_S > 413
    assert daemon.stop_wait(None) == daemon.STOP_TIMEOUT_S  # a server that recorded none
    _stop(cwd, env)  # nothing to drain: at once
    assert wait_gone(pid, timeout=5)
    assert daemon.recorded_grace(pid) is None
    assert not (Path(env["TMPDIR"]) / f"{PID_FILE}.json").exists()
