"""Worker processes ``torchbay serve`` spawns first thing, before its own imports (see
:class:`EarlyWorkers`)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

from torchbay.server.early_stop import runs_server

# Value flags of `serve` that name start-up models (no early worker without one of them).
_MODEL_FLAGS = ("--models", "--ts-config")


def _flag(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in ``argv`` (``--x v`` or ``--x=v``), or None."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.partition("=")[2]
    return None


def _serves_models(argv: list[str]) -> bool:
    """``argv`` runs the server in this process (not ``--start``'s parent, ``--stop``, help) with
    start-up models named on the command line or in a config file."""
    if not runs_server(argv):
        return False
    flags = {arg.partition("=")[0] for arg in argv}
    return bool(flags & set(_MODEL_FLAGS))


@dataclass
class EarlyWorkers:
    """Worker processes ``serve`` spawned first thing (``spawn_early``), so that their torch
    import, the slowest step of a start, overlaps the frontend's imports and config instead of
    following them. Their stdout and stderr are a pipe of their own until ``adopt`` forwards it
    into the frontend's ``WorkerOutput`` (model_log.log), line by line."""

    log_format: str
    spawned: list[Any]
    read_fd: int
    forwarder: threading.Thread | None = None

    def adopt(self, log_format: str) -> list[Any]:
        """The workers for a server whose fds 1 and 2 are now its WorkerOutput pipe; none (all
        discarded) when the config chose another log format than the one they were given."""
        if log_format != self.log_format:
            self.close()
            return []
        from torchbay.server.serving.handle import Spawned

        spawned = [Spawned(early.proc, early.sock) for early in self.spawned]
        self.spawned = []
        read_fd, self.read_fd = self.read_fd, -1
        self.forwarder = threading.Thread(
            target=_forward, args=(read_fd,), name="torchbay-early-output", daemon=True
        )
        self.forwarder.start()
        return spawned

    def join_output(self, timeout: float = 5.0) -> None:
        """Wait (bounded) until the adopted workers' last lines are forwarded: they have exited
        (the server stopped them), and the frontend's fd 1 is still the WorkerOutput pipe."""
        if self.forwarder is not None:
            self.forwarder.join(timeout)

    def close(self) -> None:
        """Stop the workers nobody adopted (idle: they have nothing to lose)."""
        for spawned in self.spawned:
            spawned.sock.close()
            spawned.proc.kill()
            spawned.proc.wait()
        self.spawned = []
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1


def _forward(read_fd: int) -> None:
    """Copy the early workers' output to fd 1 whole lines at a time, until they all exit."""
    with open(read_fd, "rb") as pipe:
        for line in pipe:
            with contextlib.suppress(OSError):
                os.write(1, line)


def spawn_early(argv: list[str]) -> EarlyWorkers | None:
    """One worker process for a ``serve`` that names start-up models, before anything else is
    imported or read; None for any other command (or when the spawn fails: the server then
    spawns its workers as it always did)."""
    if not _serves_models(argv):
        return None
    log_format = _flag(argv, "--log-format") or "text"
    read_fd, write_fd = os.pipe()
    try:
        spawned = _spawn_worker(log_format, write_fd)
    except OSError:
        os.close(read_fd)
        return None
    finally:
        os.close(write_fd)
    return EarlyWorkers(log_format, [spawned], read_fd)


def _spawn_worker(log_format: str, output_fd: int) -> Any:
    """``serving.handle.spawn_process``'s worker with ``output_fd`` as its stdout and stderr,
    started before that module (and asyncio, which it imports) is: subprocess and socket only."""
    import socket
    import subprocess

    from torchbay.server.serving.worker_env import worker_env

    parent, child = socket.socketpair()
    args = [sys.executable, "-m", "torchbay.server.worker", "--fd", str(child.fileno())]
    try:
        proc = subprocess.Popen(
            [*args, "--log-format", log_format],
            pass_fds=(child.fileno(),),
            env=worker_env(os.environ),
            stdin=subprocess.DEVNULL,
            stdout=output_fd,
            stderr=output_fd,
            start_new_session=True,  # as spawn_process: the frontend stops it, not a signal
        )
    except BaseException:
        parent.close()
        raise
    finally:
        child.close()
    return _Early(proc, parent)


@dataclass
class _Early:
    """What ``Spawned`` holds (``adopt`` makes one of it; close() needs only these two)."""

    proc: Any
    sock: Any
