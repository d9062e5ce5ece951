"""How a worker process comes to be: spawned (``python -m torchbay.server.worker`` on one end of
a socketpair) or, through a ``SpawnFn`` such as ``ForkServer.spawn`` (serving/forkserver.py),
forked from the worker template; ``spawn_off_loop`` runs either in a thread, so that neither a
template's answer nor a big frontend's fork stalls the event loop. Torch-free."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torchbay.server.serving.worker_env import start_worker, worker_env

__all__ = ["SpawnFn", "Spawned", "end_group", "spawn_off_loop", "spawn_process"]

# (env, python, log format) -> a spawned worker process: the seam a test uses to make spawning
# fail (OSError EMFILE/ENOMEM from Popen) the way an exhausted host does.
SpawnFn = Callable[["Mapping[str, str] | None", str, str], "Spawned"]


@dataclass
class Spawned:
    """A started worker process that has not been sent its ``Load`` yet."""

    proc: subprocess.Popen
    sock: socket.socket  # the frontend's end of the socketpair

    def discard(self) -> None:
        """Close our end: an idle worker sees EOF and exits."""
        self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def spawn_process(
    env: Mapping[str, str] | None = None, python: str = sys.executable, log_format: str = "text"
) -> Spawned:
    """Start ``python -m torchbay.server.worker`` on one end of a socketpair (synchronous, cheap).

    The worker imports torch and the handlers at once and then waits for its ``Load``, so a
    process spawned early overlaps torch's import with the frontend's own start-up.
    """
    env = worker_env(os.environ if env is None else env)
    return Spawned(*start_worker(python, log_format, env))


def end_group(pid: int) -> None:
    """Kill what is left of the exited worker ``pid``'s process group: the processes its handler
    started (a helper server, DataLoader workers), which would run on under init. A worker leads
    its own session (``start_new_session`` here, ``setsid`` in a forked one), so its group holds
    nothing of the server's. Called before the worker is reaped: a zombie's pid, and so its group
    id, cannot have been reused by another process."""
    with contextlib.suppress(OSError):  # gone already, or no group of its own
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)


async def spawn_off_loop(
    spawn: SpawnFn, env: Mapping[str, str] | None, python: str, log_format: str
) -> Spawned:
    """``spawn(env, python, log_format)`` in a thread. A caller cancelled meanwhile (a slot
    retired while its worker starts) leaves no process behind: it is discarded once it exists."""
    future = asyncio.get_running_loop().run_in_executor(None, spawn, env, python, log_format)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_discard_unwanted)
        raise


def _discard_unwanted(future: asyncio.Future[Spawned]) -> None:
    """A process spawned for a start that was cancelled meanwhile: discarded (in a thread:
    ``discard`` waits for it to exit)."""
    if not future.cancelled() and future.exception() is None:
        spawned = future.result()
        threading.Thread(target=spawned.discard, name="discard-worker", daemon=True).start()
