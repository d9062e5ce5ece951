"""``torchbay serve --start`` / ``--stop``: a server in the background, as ``torchserve`` runs one.

``--start`` runs ``torchbay serve`` again as a child in its own session (stdin /dev/null, stdout
and stderr pipes to this process, a third pipe for "ready"), writes the pid file, and relays the
child's console until the child is up: its listeners bound and its startup models loaded (or
reported failed). Then the child's console goes to /dev/null (its logs go on in ``logs/``) and
``--start`` exits 0. A child that fails to start has printed its one line; ``--start`` exits with
the child's code (1, or 2 for a configuration error). A child stopped before it was ready
(``--stop`` or a signal while it starts) is one line and exit 1 too: not started. ``--stop``
sends SIGTERM to the pid in the pid file and waits for the drain.

The pid file is TorchServe's: ``.model_server.pid`` in ``tempfile.gettempdir()`` (``TMPDIR``,
``TEMP``, ``TMP``, ``/tmp``), holding the pid only. A pid is only ever signalled if its command
line is a torchbay server this module started (``--daemon-fd``); a TorchServe named there is left
alone, and so is one that is not the process the pid file was written for (its start differs
from the record beside it: server/daemon_record.py). ``--foreground`` (and a plain
``torchbay serve``) neither reads nor writes the pid file.
``--start`` reads the pid file and writes its server's pid under ``flock`` of
``.model_server.pid.lock`` beside it (``_claim``; ``--stop`` reads and signals under it too): of
two ``--start`` at the same instant, one starts the server and the other says it is already
running. The kernel drops the lock when its holder dies: a ``--start`` killed half-way blocks
nobody. The server records its ``shutdown_grace_s`` beside the pid file
(``.model_server.pid.json``): ``--stop`` waits for its stop as long as the server's own bound
(``serve.stop_bound``) plus ``STOP_MARGIN_S``, however long the grace.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

from torchbay.server import daemon_record
from torchbay.server.errors import TorchbayError

PID_FILE_NAME = ".model_server.pid"
DAEMON_FLAG = "--daemon-fd"  # the child's hidden flag: the fd it writes "ready" to
READY = b"ready\n"
STOP_TIMEOUT_S = 300.0  # --stop's wait for a server that recorded no grace (still starting)
# --stop's wait past the server's stop bound: the process's last steps (the start-up cut short,
# the worker template's exit, the log files closed, the interpreter's exit) on a loaded host.
STOP_MARGIN_S = 30.0
TORCHSERVE_CLASS = "org.pytorch.serve.ModelServer"  # what TorchServe's launcher checks for
CLASS_FLAG = "--ts-class"  # the child's hidden flag that carries TORCHSERVE_CLASS


def pid_file() -> Path:
    return Path(tempfile.gettempdir()) / PID_FILE_NAME


@contextlib.contextmanager
def _claim(path: Path) -> Iterator[None]:
    """Hold the pid file's lock (``<pid file>.lock``, created if need be, never removed): one
    ``--start`` or ``--stop`` at a time reads the pid file and acts on what it names. Each holds
    it for milliseconds (a check, a spawn, a write); a holder that dies releases it."""
    lock = path.with_name(f"{path.name}.lock")
    try:  # read-only (flock needs no more); one of another user's in /tmp opens without O_CREAT
        try:
            fd = os.open(lock, os.O_RDONLY)
        except FileNotFoundError:
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError as exc:
        raise TorchbayError(f"cannot open the lock file {lock}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock goes with it


def record_grace(pid: int, grace_s: float) -> None:
    """The server ``pid`` (``--start``'s) stops within ``stop_bound(grace_s)``: for --stop."""
    daemon_record.write(pid_file(), pid, shutdown_grace_s=grace_s)


def recorded_grace(pid: int) -> float | None:
    """The ``shutdown_grace_s`` the server ``pid`` recorded, if it did."""
    grace = daemon_record.read(pid_file(), pid).get("shutdown_grace_s")
    return float(grace) if isinstance(grace, int | float) else None


def stop_wait(grace_s: float | None) -> float:
    """How long --stop waits for a server to stop: its own bound for the grace it recorded, plus
    STOP_MARGIN_S; STOP_TIMEOUT_S when it recorded none."""
    if grace_s is None:
        return STOP_TIMEOUT_S
    from torchbay.server.serve import stop_bound  # the server's modules: only now

    return stop_bound(grace_s) + STOP_MARGIN_S


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _ours(pid: int) -> psutil.Process | None:
    """The running torchbay server started by ``--start`` with this pid, else None."""
    try:
        proc = psutil.Process(pid)
        cmdline = proc.cmdline()
    except psutil.Error:
        return None
    if DAEMON_FLAG in cmdline and "serve" in cmdline:
        return proc
    return None


def _is_torchserve(pid: int) -> bool:
    try:
        return any(TORCHSERVE_CLASS in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _running(path: Path) -> tuple[int | None, psutil.Process | None]:
    """(pid in the file, our server or None). A file naming neither our server nor a running
    TorchServe (a dead pid, a pid reused since) is stale and removed."""
    pid = _read_pid(path)
    proc = None
    if pid is not None and not daemon_record.reused(path, pid):
        proc = _ours(pid)
    if proc is None and not (pid is not None and _is_torchserve(pid)):
        # Not there, or not removable (a folder of that name): --start's pid file write says so.
        with contextlib.suppress(OSError):
            path.unlink()
        if pid is not None:
            daemon_record.remove(path, pid)
    return pid, proc


def _write_pid(path: Path, pid: int) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(str(pid))
        tmp.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def remove_pid_file(pid: int) -> None:
    """Remove the pid file if it still names ``pid`` (the server's own exit)."""
    path = pid_file()
    if _read_pid(path) == pid:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    daemon_record.remove(path, pid)


def start(argv: Sequence[str]) -> int:
    """Start ``torchbay <argv>`` (a ``serve`` command line) in the background; see the module."""
    path = pid_file()
    with _claim(path):  # checked and claimed at once: no other --start between the two
        child, pipes, ready_read = _spawn(path, argv)
    try:
        _relay(pipes)
        with open(ready_read, "rb") as ready:
            up = ready.read() == READY
    except KeyboardInterrupt:  # the server goes on starting (its own session); --stop stops it
        print(
            f"torchbay: interrupted: the server (pid {child.pid}) goes on starting in the "
            "background; torchbay serve --stop stops it",
            file=sys.stderr,
        )
        return 130
    if up:
        return 0
    code = child.wait()
    remove_pid_file(child.pid)
    if code > 0:  # it printed its one line (1: an error, 2: a configuration error)
        return code
    raise TorchbayError(_stopped_before_ready(child.pid, code))


def _spawn(path: Path, argv: Sequence[str]) -> tuple[subprocess.Popen, dict[int, Any], int]:
    """Unless a server runs: the child started, its pid written: (the child, its stdout and
    stderr pipes to relay, the read end of its "ready" pipe)."""
    pid, proc = _running(path)
    if proc is not None:
        raise TorchbayError(
            f"torchbay is already running (pid {pid}), please use torchbay serve --stop to stop it"
        )
    if pid is not None and _is_torchserve(pid):
        raise TorchbayError(
            f"TorchServe is running (pid {pid} in {path}): stop it with torchserve --stop, or "
            "give torchbay its own TMPDIR"
        )
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    ready_read, ready_write = os.pipe()
    args = [a for a in argv if a != "--start"]
    # TORCHSERVE_CLASS on the command line: SageMaker's toolkit, having run ``torchserve --start``,
    # waits on the process whose command line holds it (torchserve._retrieve_ts_server_process).
    marker = [CLASS_FLAG, TORCHSERVE_CLASS]
    cmd = [sys.executable, "-m", "torchbay", *args, DAEMON_FLAG, str(ready_write), *marker]
    try:
        child = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out_write,
            stderr=err_write,
            pass_fds=(ready_write,),
            start_new_session=True,  # Ctrl-C or a closed terminal must not reach it
        )
    finally:
        for fd in (out_write, err_write, ready_write):
            os.close(fd)
    try:
        _write_pid(path, child.pid)
        daemon_record.write(
            path, child.pid
        )  # which process that pid is (the server adds its grace)
    except OSError as exc:  # a server nobody could --stop is not started
        child.kill()
        child.wait()
        raise TorchbayError(f"cannot write the pid file {path}: {exc.strerror or exc}") from None
    return child, {out_read: _binary(sys.stdout), err_read: _binary(sys.stderr)}, ready_read


def _stopped_before_ready(pid: int, code: int) -> str:
    """Why a server that exited 0 (a stop asked while it started: ``--stop``, SIGTERM, SIGINT)
    or was killed by a signal (-N: SIGKILL, or a SIGTERM as its interpreter started) is not
    started."""
    if code == 0:
        return f"the server (pid {pid}) was stopped before it was ready"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"the server (pid {pid}) was stopped by {name} before it was ready"


def _binary(stream: Any) -> Any:
    return getattr(stream, "buffer", None) or _TextSink(stream)


class _TextSink:
    """A text stream (pytest's capture) taking bytes."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: bytes) -> None:
        self._stream.write(data.decode("utf-8", "replace"))

    def flush(self) -> None:
        self._stream.flush()


def _relay(pipes: dict[int, Any]) -> None:
    """Copy the child's stdout and stderr to ours until it closes both (ready, or exited). A
    stream of ours that cannot be written any more (``| grep -m1 ready`` done, a terminal gone)
    is dropped, and the wait for ready goes on."""
    with selectors.DefaultSelector() as selector:
        for fd, sink in pipes.items():
            selector.register(fd, selectors.EVENT_READ, sink)
        while selector.get_map():
            for key, _ in selector.select():
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                    os.close(key.fd)
                elif key.data is not None:
                    try:
                        key.data.write(chunk)
                        key.data.flush()
                    except OSError:
                        _drop(key.data)
                        selector.modify(key.fd, selectors.EVENT_READ, None)


def _drop(sink: Any) -> None:
    """Our stream that broke writes to /dev/null from now on, so that the interpreter's last
    flush of it does not fail either (exit 120)."""
    try:
        fd = sink.fileno()
    except (OSError, ValueError, AttributeError):  # not a file (pytest's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def stop(timeout: float | None = None) -> int:
    """``--stop``: SIGTERM the server of the pid file, wait until it is gone (``timeout``, else
    ``stop_wait``)."""
    path = pid_file()
    with _claim(path):  # a --start under way has written its pid: that server is stopped
        pid, proc = _running(path)
        if proc is None:
            print("torchbay is not currently running.")
            return 0
        grace = recorded_grace(proc.pid)  # read first: the server removes it as it exits
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
        except psutil.AccessDenied:
            raise TorchbayError(f"cannot stop torchbay (pid {pid}): permission denied") from None
    assert pid is not None
    if timeout is None:
        timeout = stop_wait(grace)
    if not _wait_gone(proc, timeout):
        raise TorchbayError(
            f"torchbay (pid {pid}) did not stop within {timeout:g}s; it is still draining or stuck"
        )
    remove_pid_file(pid)
    print("torchbay has stopped.")
    return 0


def _wait_gone(proc: psutil.Process, timeout: float) -> bool:
    """Poll until the server exited (a zombie counts: its parent, not us, must reap it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


class ReadyNotice:
    """The child's side: tell the ``--start`` process the server is up (once)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        os.set_inheritable(fd, False)  # workers must not hold it open

    def send(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError), open(fd, "wb") as out:
            out.write(READY)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
