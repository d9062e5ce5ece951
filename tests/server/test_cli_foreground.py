"""``torchbay serve`` / ``--foreground``: today's behaviour (in this process, logs on the console),
plus TorchServe's log files under ``LOG_LOCATION``, one shutdown line, no pid file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from .cli_helpers import (
    PID_FILE,
    clean_env,
    free_addresses,
    hold_import,
    kill_tree,
    lines,
    predict,
    read_ready,
    serve_foreground,
    wait_for,
    wait_gone,
)
from .conftest import load_gated_store

pytestmark = pytest.mark.slow


def test_foreground_logs_to_the_console_and_to_log_location(tmp_path, talk_store):
    cwd, logs = tmp_path / "run", tmp_path / "elsewhere" / "logs"
    cwd.mkdir()
    env = clean_env(tmp_path / "tmp", LOG_LOCATION=str(logs))
    (cwd / "log4j2.xml").write_text("<Configuration><Loggers/></Configuration>\n")
    ready, console, errors = cwd / "ready.json", cwd / "console.log", cwd / "errors.log"
    with console.open("wb") as out, errors.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torchbay", "serve", "--foreground", "--ncs",
             "--model-store", str(talk_store), "--models", "talk=talk.mar",
             "--disable-token-auth", "--log-config", "log4j2.xml", "--ready-file", str(ready),
             *free_addresses()],
            cwd=cwd, env=env, stdout=out, stderr=err,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 100
        while not ready.exists():
            assert proc.poll() is None, console.read_text()
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.05)
        info = read_ready(ready)
        assert info["pid"] == proc.pid  # in this process, not in the background
        assert not (tmp_path / "tmp" / PID_FILE).exists()  # --foreground writes no pid file
        assert predict(info["inference"]).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        kill_tree(proc.pid)

    shown = console.read_text()
    assert errors.read_text() == ""  # the log is on stdout, as TorchServe's
    # The console has it all, as before: the frontend, the access line, the workers' output.
    for expected in ("torchbay.serve: torchbay", "POST /predictions/talk", "print on stdout"):
        assert expected in shown
    # A log4j2 file is not ours to read: one warning says so.
    warnings = [line for line in shown.splitlines() if "log4j2" in line]
    assert len(warnings) == 1 and "WARNING torchbay.logs: --log-config log4j2.xml" in warnings[0]
    # One shutdown line, not one "Shutting down" per uvicorn listener.
    assert [line for line in shown.splitlines() if "hutting down" in line] == [
        next(line for line in shown.splitlines() if "torchbay.serve: shutting down" in line)
    ]
    assert not (cwd / "logs").exists()  # LOG_LOCATION moved them
    assert sorted(p.name for p in logs.iterdir()) == [
        "access_log.log",
        "model_log.log",
        "ts_log.log",
    ]
    assert "print on stderr" in (logs / "model_log.log").read_text()
    assert len(lines(logs / "access_log.log")) == 1
    assert set(lines(logs / "ts_log.log")) <= set(shown.splitlines())  # the same lines
    assert "shutting down" in (logs / "ts_log.log").read_text()


def test_an_unwritable_log_location_leaves_the_console(tmp_path, talk_store):
    """A read-only working directory (a container) still serves: one warning, console only."""
    cwd = tmp_path / "run"
    cwd.mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory\n")
    env = clean_env(tmp_path / "tmp", LOG_LOCATION=str(blocker / "logs"))
    ready = cwd / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchbay", "serve", "--model-store", str(talk_store),
         "--disable-token-auth", "--ready-file", str(ready), *free_addresses()],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 100
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
    finally:
        kill_tree(proc.pid)
    warning = [line for line in out.splitlines() if "cannot write log files" in line]
    assert len(warning) == 1, out
    assert warning[0].endswith(f"cannot write log files in {blocker / 'logs'} (not a directory): "
                               "console only")  # fmt: skip


@pytest.mark.parametrize(
    "held_in",
    [
        "torchbay.archiver.cli",  # the command's imports (its first worker spawned)
        "torchbay.server.config.sources",  # reading the configuration
        "torchbay.server.serve",  # the server's imports: listeners bound, workers spawned
    ],
)
def test_a_sigterm_while_the_server_starts_is_a_clean_stop(tmp_path, talk_store, held_in):
    """A pod deleted as it starts: SIGTERM before the server's loop owns its signals (the start
    held at an import) stops it cleanly: exit 0, nothing on stderr, its workers gone. It was
    killed by SIGTERM's default action (exit -15), a failed container."""
    hold, held = hold_import(tmp_path, held_in)
    env = clean_env(tmp_path / "tmp", **hold)
    command = [sys.executable, "-m", "torchbay", "serve", "--foreground", "--ncs", "--dt"]
    command += ["--model-store", str(talk_store), "--models", "talk=talk.mar", *free_addresses()]
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(held, proc)
        family = psutil.Process(proc.pid).children(recursive=True)
        assert family  # the worker spawned before the imports, at least
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        kill_tree(proc.pid)
        proc.communicate()
    assert (proc.returncode, err) == (0, ""), out
    assert "Traceback" not in out
    assert all(wait_gone(child.pid, timeout=30) for child in family)


# Every option of TorchServe 0.12's `torchserve --help` (ts/arg_parser.py), short forms included.
TORCHSERVE_FLAGS = {
    "-v": [], "--version": [], "--start": [], "--stop": [], "--ts-config": ["c"],
    "--model-store": ["s"], "--workflow-store": ["w"], "--models": ["m.mar"],
    "--log-config": ["l"], "--cpp-log-config": ["l"], "--foreground": [],
    "--no-config-snapshots": [], "--ncs": [], "--plugins-path": ["p"], "--ppath": ["p"],
    "--disable-token-auth": [], "--dt": [], "--enable-model-api": [],
}  # fmt: skip


@pytest.mark.parametrize("flag", TORCHSERVE_FLAGS)
def test_every_torchserve_flag_is_taken(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """README: TorchServe's flags work, so scripts change only the binary name."""
    from torchbay.cli import build_parser

    try:
        args = build_parser().parse_args(["serve", flag, *TORCHSERVE_FLAGS[flag]])
    except SystemExit as done:  # -v / --version print the version and exit 0, as TorchServe's
        assert done.code == 0 and capsys.readouterr().out.startswith("torchbay ")
        return
    assert args.func.__name__ == "run_serve"
    if flag == "--dt":
        assert args.disable_token_auth is True


def test_torchserves_short_flags_start_the_server(tmp_path, talk_store):
    """``--dt`` (TorchServe's --disable-token-auth), ``--ppath`` and ``--cpp-log-config``
    (noted and ignored): a TorchServe script's command line serves, without keys."""
    cwd = tmp_path / "run"
    cwd.mkdir()
    args = ["--model-store", str(talk_store), "--models", "talk=talk.mar", "--dt"]
    args += ["--ppath", "plugins", "--cpp-log-config", "cpp.yaml"]
    proc, info = serve_foreground(args, cwd, clean_env(tmp_path / "tmp"))
    try:
        assert predict(info["inference"]).status_code == 200  # no key needed
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        kill_tree(proc.pid)


def test_tritons_allow_client_shm_true_starts_a_server_that_offers_shared_memory(
    tmp_path, talk_store
):
    """``--allow-client-shm=true``, Triton's form (its docs, and its refusal's words): the
    server starts with client shared memory on (it exited 2 before: 'ignored explicit
    argument'); ``=false`` and the bare switch read as Triton's boolean, a word that is none
    is refused by name."""
    from torchbay.cli import build_parser

    parser = build_parser()
    for given, value in (("=false", False), ("=0", False), ("=TRUE", True), ("", True)):
        assert parser.parse_args(["serve", f"--allow-client-shm{given}"]).allow_client_shm is value
    bad = subprocess.run(
        [sys.executable, "-m", "torchbay", "serve", "--allow-client-shm=maybe"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "'maybe' is not a boolean" in bad.stderr
    cwd = tmp_path / "run"
    cwd.mkdir()
    args = ["--model-store", str(talk_store), "--dt", "--allow-client-shm=true"]
    proc, info = serve_foreground(args, cwd, clean_env(tmp_path / "tmp"))
    try:
        server = httpx.get(f"http://127.0.0.1:{info['inference']}/v2", timeout=30).json()
        assert "system_shared_memory" in server["extensions"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        kill_tree(proc.pid)
        proc.wait()


def test_a_console_closed_under_the_server_is_a_clean_stop(tmp_path, tmp_path_factory):
    """``torchbay serve | tee server.log`` and Ctrl-C: tee is gone before the server's last
    lines. Here the reader of its stdout and stderr closes them while the model loads; the
    server serves, and SIGTERM stops it with exit 0 (it exited 120: the last flush of its
    console failed)."""
    gate = tmp_path / "gate"
    store, load_started = load_gated_store(tmp_path_factory, tmp_path, "gone-console", gate=gate)
    cwd = tmp_path / "run"
    cwd.mkdir()
    ready = cwd / "ready.json"
    command = [sys.executable, "-m", "torchbay", "serve", "--foreground", "--ncs", "--dt",
               "--model-store", str(store), "--models", "gated=gated.mar",
               "--ready-file", str(ready), *free_addresses()]  # fmt: skip
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=clean_env(tmp_path / "tmp"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        deadline = time.monotonic() + 100
        while not load_started.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.stdout.close()
        proc.stderr.close()
        gate.touch()
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        ping = httpx.get(f"http://127.0.0.1:{read_ready(ready)['inference']}/ping", timeout=30)
        assert ping.status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=100) == 0
    finally:
        kill_tree(proc.pid)
        proc.wait()
    server_log = (cwd / "logs" / "ts_log.log").read_text()
    assert "BrokenPipeError" not in server_log and "lost sys.stderr" not in server_log
