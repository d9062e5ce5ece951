"""SIGINT and SIGTERM of a server run in the main thread: each asks the stop, from ``install``
until the process exits (ignored once the stop is done: ``settle``)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def install(on_signal: Callable[[int], None]) -> bool:
    """``on_signal(sig)`` on the running loop for each stop signal; True when installed (the
    main thread only: elsewhere the process's owner decides)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    loop = asyncio.get_running_loop()
    installed = False
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed = True
    return installed


def settle() -> None:
    """The stop is done: the stop signals are ignored from now on. The loop's close would put
    their defaults back, and a signal repeated in the process's last steps (Kubernetes' or
    systemd's second SIGTERM, Ctrl-C pressed again; log files closed, pid file removed, the
    interpreter's exit) killed a process that had stopped cleanly: exit -15 or -2, a failure."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.remove_signal_handler(sig)  # the default for an instant, then ignored
        signal.signal(sig, signal.SIG_IGN)
