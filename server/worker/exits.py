"""How a worker process ends: ``exit_now``, without the interpreter's teardown, its atexit hooks
bounded, and, once its frontend is gone, with its process group."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading

# A worker's exit waits this long for its atexit hooks: one may block for good (multiprocessing's
# joins a non-daemon child the handler started and never stopped).
EXIT_HOOKS_S = 5.0
# Set once the frontend is gone (EOF on the worker's socket): nobody else will end this worker's
# process group, the processes its handler started.
FRONTEND_GONE = threading.Event()


def exit_now(code: int) -> None:
    """End the process with ``code`` without the interpreter's teardown.

    With torch imported, CPython's finalization (every module's globals cleared, torch's objects
    collected) takes 2-3 s of CPU on a loaded 2-core host, paid by every worker that stops:
    at shutdown, scale-down, recycling. The atexit hooks still run (a handler's, torch's, and
    logging's, which flushes and closes every log handler), for ``EXIT_HOOKS_S`` at most, then
    stdout and stderr are flushed; only the module teardown is skipped, as a forked child already
    does (``template.py``). A worker whose frontend is gone (``FRONTEND_GONE``) takes its process
    group with it: the frontend would have ended it (``spawning.end_group``), and cannot.
    """
    watchdog = threading.Timer(EXIT_HOOKS_S, _exit, (code,))
    watchdog.daemon = True
    watchdog.start()
    atexit._run_exitfuncs()
    _exit(code)


def _exit(code: int) -> None:
    flush_stdio()
    if FRONTEND_GONE.is_set() and os.getpgid(0) == os.getpid():  # a worker leads its group
        os.killpg(0, signal.SIGKILL)
    os._exit(code)


def flush_stdio() -> None:
    """Write out what stdout and stderr hold (before ``os._exit``, or before a fork)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing left to lose
            stream.flush()
