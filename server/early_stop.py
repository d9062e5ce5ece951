"""SIGTERM while ``torchbay serve`` starts, before the server's event loop takes the stop
signals (``stop_signals.install``): the command's imports, the configuration, the listeners'
bind, the workers' spawn. A stop asked there is a clean stop, as one asked once the loop runs:
``Terminated`` unwinds what started (listeners closed, workers ended, pid file removed) and the
command exits 0, without a traceback. Kubernetes may send its SIGTERM that early (a pod deleted
as it starts); the default action killed the process (exit -15: a failure). Imports nothing
heavy: it is taken before anything else is imported."""

from __future__ import annotations

import signal
import threading
from types import FrameType


class Terminated(BaseException):
    """SIGTERM before the server's loop owned it (a BaseException, as KeyboardInterrupt: no
    ``except Exception`` of the start-up swallows it)."""


def runs_server(argv: list[str]) -> bool:
    """``argv`` runs the server in this process: ``serve``, not ``--start``'s parent (which
    returns once the server is up), ``--stop`` or help."""
    words = [arg for arg in argv if arg != "--debug"]
    if not words or words[0] != "serve":
        return False
    flags = {arg.partition("=")[0] for arg in words[1:]}
    if flags & {"-h", "--help", "--stop", "--version", "-v"}:
        return False
    return "--start" not in flags or bool(flags & {"--foreground", "--daemon-fd"})


def take_sigterm() -> None:
    """From now until the loop takes it, SIGTERM raises ``Terminated`` (the main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)


def _terminated(sig: int, frame: FrameType | None) -> None:
    # One stop: a repeated SIGTERM (systemd, Kubernetes) must not interrupt the unwinding.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated
