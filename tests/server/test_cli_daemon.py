"""``torchbay serve --start`` / ``--stop`` as ``torchserve --start`` / ``--stop`` (recorded in
tests/data/torchserve_0.12/cli.md): the real command, a real server in the background."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from torchbay.cli import main
from torchbay.server import daemon, daemon_record
from torchbay.server.errors import TorchbayError

from .cli_helpers import (
    PID_FILE,
    free_addresses,
    lines,
    predict,
    read_ready,
    torchbay,
    wait_gone,
)

pytestmark = pytest.mark.slow


def test_start_serves_in_the_background_until_stop(cli_run, talk_store):
    cwd, env = cli_run
    pid_file = Path(env["TMPDIR"]) / PID_FILE
    ready = cwd / "ready.json"
    args = ["serve", "--start", "--ncs", "--model-store", str(talk_store), "--models"]
    args += ["talk=talk.mar", "--disable-token-auth", *free_addresses(), "--ready-file", str(ready)]
    started = torchbay(cwd, env, *args)
    assert started.returncode == 0, started.stderr
    # --start returned once the server was up: its ready file and the pid file are there now.
    info = read_ready(ready)
    assert pid_file.read_text() == str(info["pid"])  # the pid only, as TorchServe writes it
    assert info["failed_models"] == {}
    assert "ready: inference" in started.stdout  # its start-up log, relayed (stdout, as TorchServe)
    assert started.stderr == ""
    assert psutil.pid_exists(info["pid"])
    assert os.getsid(info["pid"]) != os.getsid(0)  # its own session: Ctrl-C here cannot reach it

    reply = predict(info["inference"])
    assert reply.status_code == 200, reply.text

    again = torchbay(cwd, env, *args)
    assert again.returncode == 1  # TorchServe: "TorchServe is already running, ..." exit 1
    assert again.stderr.splitlines() == [
        f"torchbay: error: torchbay is already running (pid {info['pid']}), please use "
        "torchbay serve --stop to stop it"
    ]
    assert predict(info["inference"]).status_code == 200  # the first one is untouched

    stopped = torchbay(cwd, env, "serve", "--stop")
    assert (stopped.returncode, stopped.stdout) == (0, "torchbay has stopped.\n")
    assert wait_gone(info["pid"], timeout=5)  # --stop waited for the drain (TorchServe does not)
    assert not pid_file.exists()

    logs = cwd / "logs"
    assert sorted(p.name for p in logs.iterdir()) == [
        "access_log.log",
        "model_log.log",
        "ts_log.log",
    ]
    access = lines(logs / "access_log.log")
    assert len(access) == 2 and all('"POST /predictions/talk HTTP/1.1" 200' in a for a in access)
    model_log = (logs / "model_log.log").read_text()
    assert "talk handler: print on stdout" in model_log  # a handler's print, as TorchServe's
    assert "talk handler: print on stderr" in model_log
    # worker records
    assert "torchbay.handlers.runtime.loading: loaded torchscript model" in model_log
    assert "torchbay.access" not in model_log and "torchbay.serve" not in model_log
    server_log = (logs / "ts_log.log").read_text()
    for expected in ("torchbay.serve: torchbay", "POST /predictions/talk", "print on stdout"):
        assert expected in server_log  # everything, as TorchServe's ts_log.log
    # After --start returned, nothing more reached the terminal that started it.
    assert "shutting down" not in started.stdout and "talk handler" not in started.stdout
    shutdown = [line for line in server_log.splitlines() if "hutting down" in line]
    assert shutdown == [shutdown[0]] and "torchbay.serve: shutting down: draining" in shutdown[0]

    gone = torchbay(cwd, env, "serve", "--stop")
    assert (gone.returncode, gone.stdout, gone.stderr) == (
        0,
        "torchbay is not currently running.\n",
        "",
    )


def test_stop_with_nothing_running_and_stale_pid_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the pid file lives
    pid_file = tmp_path / PID_FILE
    assert main(["serve", "--stop"]) == 0  # TorchServe: "TorchServe is not currently running."
    assert capsys.readouterr().out == "torchbay is not currently running.\n"

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    pid_file.write_text(dead.stdout.strip())  # a pid that no longer runs
    assert main(["serve", "--stop"]) == 0
    assert capsys.readouterr().out == "torchbay is not currently running.\n"
    assert not pid_file.exists()  # stale: removed

    # A live process that is not a torchbay server is never signalled.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_file.write_text(str(bystander.pid))
        assert main(["serve", "--stop"]) == 0
        assert capsys.readouterr().out == "torchbay is not currently running.\n"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_pid_file_that_is_a_folder_is_not_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / PID_FILE).mkdir()  # nothing it names runs: --stop has nothing to stop
    assert main(["serve", "--stop"]) == 0
    assert capsys.readouterr().out == "torchbay is not currently running.\n"
    # --start cannot write its pid file there: one line, and no server left running.
    code = main(["serve", "--start", "--model-store", str(tmp_path), "--ncs"])
    assert code == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"torchbay: error: cannot write the pid file {tmp_path / PID_FILE}: Is a directory"
    ]
    # No temporary pid file left; the lock file beside it stays (daemon._claim).
    assert sorted(p.name for p in tmp_path.iterdir()) == [PID_FILE, f"{PID_FILE}.lock"]


def _fake_server() -> subprocess.Popen:
    """A process that --start and --stop take for their server (``serve --daemon-fd`` on its
    command line) and that ignores SIGTERM; it prints "ignoring" once it does."""
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring', flush=True); time.sleep(60)"
    )
    command = [sys.executable, "-c", code, "serve", "--daemon-fd", "0"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def _waits_on_lock(pid: int, proc: subprocess.Popen) -> bool:
    """Until ``pid`` waits for a flock (a "->" line of /proc/locks): True; False if ``proc``
    exits first."""
    deadline = time.monotonic() + 100
    while time.monotonic() < deadline and proc.poll() is None:
        with open("/proc/locks") as locks:
            if any("-> FLOCK" in line and f" {pid} " in line for line in locks):
                return True
        time.sleep(0.02)
    return False


def test_two_starts_at_once_start_one_server(cli_run, talk_store):
    """Two --start at the same instant both passed the "already running" check and started two
    servers, the pid file naming only one. Here the test holds the claim (the pid file's lock)
    as a --start that is spawning its server would: the second --start waits for it, then sees
    the first one's server (a stand-in that ignores SIGTERM) and refuses, exit 1."""
    cwd, env = cli_run
    pid_file = Path(env["TMPDIR"]) / PID_FILE
    first = _fake_server()
    lock = os.open(pid_file.with_name(f"{PID_FILE}.lock"), os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first --start, between its check and its write
        command = [sys.executable, "-m", "torchbay", "serve", "--start", "--ncs"]
        command += ["--model-store", str(talk_store), *free_addresses()]
        second = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        # It did not wait: it started a second server (the pid file names it: cli_run stops it).
        assert _waits_on_lock(second.pid, second), second.communicate()
        assert first.stdout is not None and first.stdout.readline() == "ignoring\n"
        pid_file.write_text(str(first.pid))  # the first --start's server
        os.close(lock)
        lock = -1
        out, err = second.communicate(timeout=100)
        assert second.returncode == 1, (out, err)
        assert err.splitlines() == [
            f"torchbay: error: torchbay is already running (pid {first.pid}), please use "
            "torchbay serve --stop to stop it"
        ]
        assert pid_file.read_text() == str(first.pid)
    finally:
        if lock >= 0:
            os.close(lock)
        first.kill()
        first.communicate()


def test_a_pid_reused_by_another_torchbay_server_is_left_alone(tmp_path, monkeypatch, capsys):
    """A server killed without removing its pid file (SIGKILL, the OOM killer) whose pid went
    to another torchbay server (one of another TMPDIR, here a stand-in that SIGTERM ends):
    --stop stopped that one, and --start refused to start ("already running"). The record
    beside the pid file says when the server it names started; another start is not it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = "import time; print('up', flush=True); time.sleep(60)"
    command = [sys.executable, "-c", code, "serve", "--daemon-fd", "0"]
    other = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "up\n"
        started = daemon_record.start_ticks(other.pid)
        assert started is not None
        pid_file = tmp_path / PID_FILE
        record = daemon_record.record_path(pid_file)
        pid_file.write_text(str(other.pid))  # the killed server's, as --start wrote them
        record.write_text(json.dumps({"pid": other.pid, "started": started - 1}))
        assert main(["serve", "--stop"]) == 0
        assert capsys.readouterr().out == "torchbay is not currently running.\n"
        assert other.poll() is None  # not signalled
        assert not pid_file.exists() and not record.exists()  # stale: removed

        # The record of that very process: it is the server, and --stop stops it.
        pid_file.write_text(str(other.pid))
        daemon_record.write(pid_file, other.pid)
        assert main(["serve", "--stop"]) == 0
        assert capsys.readouterr().out == "torchbay has stopped.\n"
        assert other.wait(timeout=30) == -15
    finally:
        other.kill()
        other.communicate()


def test_a_stop_that_does_not_finish_says_so(tmp_path, monkeypatch):
    """A server that ignores SIGTERM (stuck): --stop gives up after its timeout with one line."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stuck = _fake_server()
    try:
        assert stuck.stdout is not None and stuck.stdout.readline() == "ignoring\n"
        (tmp_path / PID_FILE).write_text(str(stuck.pid))
        with pytest.raises(TorchbayError) as caught:
            daemon.stop(timeout=0.5)
        assert str(caught.value) == (
            f"torchbay (pid {stuck.pid}) did not stop within 0.5s; it is still draining or stuck"
        )
        assert stuck.poll() is None and (tmp_path / PID_FILE).exists()  # left for another try
    finally:
        stuck.kill()
        stuck.communicate()  # reaps it and closes its stdout pipe


def test_a_failed_start_is_one_line_and_leaves_no_pid_file(cli_run, talk_store):
    cwd, env = cli_run
    pid_file = Path(env["TMPDIR"]) / PID_FILE
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        addresses = free_addresses()
        addresses[1] = f"http://127.0.0.1:{port}"
        store = str(talk_store)
        result = torchbay(cwd, env, "serve", "--start", "--model-store", store, *addresses)
    assert result.returncode == 1  # TorchServe's --start exits 0 here, and its server dies later
    assert result.stderr.splitlines() == [
        f"torchbay: error: cannot listen on 127.0.0.1:{port} (inference): address already in use"
    ]
    assert not pid_file.exists()

    config = cwd / "config.properties"
    # A bad value refuses the file where its default is not the safe reading (config/lenient.py)
    config.write_text("allowed_urls=file://(\n")
    result = torchbay(cwd, env, "serve", "--start", "--model-store", str(talk_store),
                      "--ts-config", str(config), *free_addresses())  # fmt: skip
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("torchbay: invalid configuration: allowed_urls: ")
    assert not pid_file.exists()

    assert not (cwd / "logs").exists()  # nothing was written


def test_a_missing_workflow_store_is_one_line(cli_run, talk_store):
    """A --workflow-store that is not there refuses the start, before anything is bound or
    written (the server started, exit 0, and every workflow registration failed later)."""
    cwd, env = cli_run
    result = torchbay(cwd, env, "serve", "--start", "--ncs", "--model-store", str(talk_store),
                      "--workflow-store", "nowhere", *free_addresses())  # fmt: skip
    assert result.returncode == 1  # TorchServe: "--workflow-store directory not found: ..."
    assert result.stderr.splitlines() == [
        f"torchbay: error: workflow store {cwd / 'nowhere'} does not exist"
    ]
    assert not (Path(env["TMPDIR"]) / PID_FILE).exists()
    assert [p.name for p in cwd.iterdir()] == []  # no logs/, no key file


def test_a_missing_log_config_or_model_store_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith(("TORCHBAY_", "TS_")):
            monkeypatch.delenv(name)
    store = str(tmp_path)
    code = main(["serve", "--model-store", store, "--log-config", "missing.yaml"])
    assert code == 1  # TorchServe: "--log-config file not found: /abs/missing.yaml", exit 1
    assert capsys.readouterr().err == "torchbay: error: --log-config file not found: missing.yaml\n"
    code = main(["serve", *free_addresses()])
    assert code == 1  # TorchServe: "Missing mandatory parameter --model-store", exit 1
    assert capsys.readouterr().err == (
        "torchbay: error: missing mandatory parameter --model-store "
        "(or model_store in --ts-config)\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing bound, written or spawned


def test_log_config_a_python_dictconfig(cli_run, talk_store):
    cwd, env = cli_run
    mine = cwd / "mine.log"
    (cwd / "logging.yaml").write_text(
        "version: 1\n"
        "incremental: false\n"
        "disable_existing_loggers: false\n"
        "formatters:\n  plain: {format: 'MINE %(levelname)s %(name)s %(message)s'}\n"
        f"handlers:\n  mine: {{class: logging.FileHandler, filename: '{mine}', "
        "formatter: plain}\n"
        "loggers:\n  torchbay.serve: {handlers: [mine], level: INFO}\n"
    )
    ready = cwd / "ready.json"
    result = torchbay(cwd, env, "serve", "--start", "--model-store", str(talk_store),
                      "--log-config", "logging.yaml", "--ready-file", str(ready),
                      *free_addresses())  # fmt: skip
    assert result.returncode == 0, result.stderr
    pid = read_ready(ready)["pid"]
    assert torchbay(cwd, env, "serve", "--stop").returncode == 0
    assert wait_gone(pid, timeout=5)
    mine_lines = lines(mine)
    assert any(line.startswith("MINE INFO torchbay.serve torchbay ") for line in mine_lines)
    assert any("shutting down" in line for line in mine_lines)
    # Our own files keep working beside it.
    assert "logging configured from logging.yaml" in (cwd / "logs" / "ts_log.log").read_text()

    (cwd / "bad.json").write_text(json.dumps({"version": 1, "handlers": {"h": {"class": "nope"}}}))
    result = torchbay(cwd, env, "serve", "--model-store", str(talk_store),
                      "--log-config", "bad.json", *free_addresses())  # fmt: skip
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("torchbay: invalid configuration: --log-config bad.json: ")


def test_a_start_whose_log_folder_cannot_be_written_says_it_will_log_nowhere(cli_run, talk_store):
    """``--start`` with LOG_LOCATION not writable: the server logs to its console only, and
    that console is ``--start``'s, gone once the server is up. The warning said "console
    only", as if its lines went on somewhere; the server then logged nothing at all."""
    cwd, env = cli_run
    blocker = cwd / "a-file"
    blocker.write_text("")
    env = {**env, "LOG_LOCATION": str(blocker / "logs")}  # under a file: cannot be made
    args = ["serve", "--start", "--ncs", "--model-store", str(talk_store)]
    started = torchbay(cwd, env, *args, "--disable-token-auth", *free_addresses())
    assert started.returncode == 0, started.stderr
    stopped = torchbay(cwd, env, "serve", "--stop")
    assert stopped.returncode == 0, stopped.stderr
    (warning,) = [line for line in started.stdout.splitlines() if "cannot write log" in line]
    assert "from then on it logs nowhere" in warning
