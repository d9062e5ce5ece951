"""The worker template (or, where workers cannot be forked, a worker) that ``torchbay serve``
starts first thing, before its own imports (see :class:`EarlyWorkers`)."""

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
    """The process ``serve`` started first thing (``spawn_early``), so that its torch import,
    the slowest step of a start, overlaps the frontend's imports and config instead of following
    them: the worker template (``template``: its process, socket and environment), which the
    server's fork server adopts and forks every start-up worker from; or, where workers cannot
    be forked (serving/forkserver.py), one worker. Its stdout and stderr are a pipe of their own
    until ``adopt`` forwards it into the frontend's ``WorkerOutput`` (model_log.log), line by
    line (a forked worker writes there itself: its fork request carries the frontend's)."""

    log_format: str
    spawned: list[Any]
    read_fd: int
    forwarder: threading.Thread | None = None
    template: tuple[Any, Any, dict[str, str]] | None = None

    def adopt(self, log_format: str, forking: bool) -> tuple[list[Any], Any]:
        """(the workers, the template) for a server whose fds 1 and 2 are now its WorkerOutput
        pipe and that forks its workers (``forking``) or not; what it cannot use is stopped: a
        template when it spawns, everything when the config chose another log format."""
        if log_format != self.log_format or (self.template is not None and not forking):
            self.close()
            return [], None
        from torchbay.server.serving.handle import Spawned

        spawned = [Spawned(early.proc, early.sock) for early in self.spawned]
        template, self.spawned, self.template = self.template, [], None
        read_fd, self.read_fd = self.read_fd, -1
        self.forwarder = threading.Thread(
            target=_forward, args=(read_fd,), name="torchbay-early-output", daemon=True
        )
        self.forwarder.start()
        return spawned, template

    def join_output(self, timeout: float = 5.0) -> None:
        """Wait (bounded) until the adopted workers' last lines are forwarded: they have exited
        (the server stopped them), and the frontend's fd 1 is still the WorkerOutput pipe."""
        if self.forwarder is not None:
            self.forwarder.join(timeout)

    def close(self) -> None:
        """Stop what nobody adopted (idle: it has nothing to lose)."""
        if self.template is not None:
            self.spawned.append(_Early(*self.template[:2]))
            self.template = None
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
    """The worker template (one worker where workers cannot be forked) for a ``serve`` that
    names start-up models, before anything else is imported or read; None for any other command
    (or when the start fails: the server then starts its own, as it always did)."""
    if not _serves_models(argv):
        return None
    log_format = _flag(argv, "--log-format") or "text"
    read_fd, write_fd = os.pipe()
    try:
        early, env = _start(log_format, write_fd, template=_forks_here())
    except OSError:
        os.close(read_fd)
        return None
    finally:
        os.close(write_fd)
    if env is not None:
        return EarlyWorkers(log_format, [], read_fd, template=(early.proc, early.sock, env))
    return EarlyWorkers(log_format, [early], read_fd)


def _forks_here() -> bool:
    """``forkserver.supported()``, without importing it (it imports the config's models)."""
    import socket

    return hasattr(os, "fork") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def _start(log_format: str, output_fd: int, template: bool) -> tuple[_Early, dict | None]:
    """A worker or the worker template as the server starts them (``worker_env.start_worker``)
    with ``output_fd`` as its stdout and stderr, before the serving modules (and asyncio, which
    they import) are imported. The template's environment comes back with it (None for a
    worker)."""
    from torchbay.server.serving.worker_env import start_worker, worker_env

    env = worker_env(os.environ)
    proc, sock = start_worker(sys.executable, log_format, env, template=template, output=output_fd)
    return _Early(proc, sock), env if template else None


@dataclass
class _Early:
    """What ``Spawned`` holds (``adopt`` makes one of it; close() needs only these two)."""

    proc: Any
    sock: Any
