"""Workers in milliseconds: the frontend's side of the worker template (a fork server).

A spawned worker spends most of a second importing torch and the handlers before it reads its
``Load``; a worker forked from a template that already imported them starts at its ``Load``
(``server/worker/template.py``). ``ForkServer.spawn`` is a ``handle.SpawnFn``: every worker start
(scale-up, restart after a death, make-before-break recycling) goes through it, and the frontend
talks to a forked worker exactly as to a spawned one (``Spawned``: a process handle and its
socket). Torch-free.

It spawns the old way instead (``handle.spawn_process``) when forking cannot give the same worker:
no template was started, it died (it is restarted for the next one), it is still not up after
``TEMPLATE_START_WAIT_S`` (a worker start waits for a template still starting: its start takes
as long as a spawned worker's), the worker needs another python, or an environment that differs in
a variable read when a process or library starts (``frozen_env``: the allocator's, the dynamic
loader's, Python's, OpenMP's and BLAS's; the template read them once, a fork cannot change them).
Every other variable is the worker's own: the child replaces its environment before the worker
reads it (``CUDA_VISIBLE_DEVICES`` included: CUDA starts in the child).

A forked worker is the template's child, not the frontend's: the template reaps it and reports
its exit code, and sends a pidfd with each fork, through which the frontend signals it (no pid
reuse race) and, if the template itself died, sees it exit (the code is then unknown: -1).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping

from torchbay.server.config.settings import ServerConfig
from torchbay.server.serving.spawning import Spawned, spawn_process
from torchbay.server.serving.worker_env import start_worker, visible_env, worker_env

log = logging.getLogger("torchbay.workers")

# Variables read once, when a process or a library starts: a fork inherits the template's.
FROZEN_PREFIXES = ("MALLOC_", "LD_", "GLIBC_", "PYTHON", "OMP_", "GOMP_", "KMP_", "MKL_")
FROZEN_PREFIXES += ("OPENBLAS_", "TORCH", "PYTORCH_")
# The template answers a fork within milliseconds; past this it is taken for broken.
FORK_REPLY_TIMEOUT_S = 10.0
# A worker start waits this long for a template still starting before it spawns instead: the
# template's start is a spawned worker's (an import of torch), so waiting costs the worker no
# time, and the fork saves its own import (N start-up models: one import, not N + 1).
TEMPLATE_START_WAIT_S = 30.0
UNKNOWN_EXIT = -1  # a forked worker that outlived its template: nobody could reap it for us
# A template the CLI started before its imports: its process, socket and environment.
EarlyTemplate = tuple[subprocess.Popen, socket.socket, Mapping[str, str]]


def supported() -> bool:
    """Fork, pidfds and SCM_RIGHTS: Linux 5.3+ on Python 3.9+."""
    return hasattr(os, "fork") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def forks(config: ServerConfig) -> bool:
    """Whether a server of ``config`` forks its workers from a template."""
    return config.worker_start == "fork" and supported()


def frozen_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a worker's environment (after ``worker_env``) a fork cannot change."""
    return {k: v for k, v in worker_env(env).items() if k.startswith(FROZEN_PREFIXES)}


class ForkedProc:
    """What ``WorkerProcess`` needs of a ``subprocess.Popen``, for a worker the template forked:
    ``pid``, ``poll``, ``wait``, ``send_signal``/``terminate``/``kill``, ``returncode``."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._lock = threading.Lock()
        self._done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """ProcessLookupError once it has exited (as ``os.kill``)."""
        with self._lock:
            if self._pidfd < 0:
                raise ProcessLookupError(self.pid)
            signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def exited(self, code: int) -> None:
        """The template reaped it (or, ``orphaned``, it exited after the template)."""
        with self._lock:
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1
            if self.returncode is None:
                self.returncode = code
        self._done.set()

    def orphaned(self) -> None:
        """The template died first: watch the pidfd for the exit (its code is lost), then end
        what is left of the worker's process group (its handler's children), which the template
        would have ended. init reaps the worker, but a group id still in use is never given to a
        new process: the group is the worker's, or empty (ESRCH) unless the pids wrapped around."""

        def watch() -> None:
            with self._lock:
                pidfd = os.dup(self._pidfd) if self._pidfd >= 0 else -1
            if pidfd >= 0:
                try:
                    select.select([pidfd], [], [])  # readable once the process has exited
                finally:
                    os.close(pidfd)
                with contextlib.suppress(OSError):  # no group left (ESRCH)
                    os.killpg(self.pid, signal.SIGKILL)
            self.exited(UNKNOWN_EXIT)

        threading.Thread(target=watch, name=f"orphan-{self.pid}", daemon=True).start()


class _Reply:
    """One fork request's answer, handed from the reader thread to the caller."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.proc: ForkedProc | None = None
        self.error = "the worker template exited"


class _Template:
    """One template process, its socket and the thread that reads what it says."""

    _ids = itertools.count(1)

    def __init__(self, proc: subprocess.Popen, ctl: socket.socket) -> None:
        """A started template process (``worker_env.start_worker``; the CLI's early one writes
        to a pipe of its own, and each fork gets the frontend's stdout and stderr with its
        request) and the frontend's end of its socket."""
        self.proc, self.ctl = proc, ctl
        self.ready = threading.Event()
        self.settled = threading.Event()  # ready, or known dead: a starting template is neither
        self.dead = False
        self.closing = False  # close() ended it: its exit code is ours, not news
        self._lock = threading.Lock()
        self._replies: dict[int, _Reply] = {}
        self._procs: dict[int, ForkedProc] = {}
        threading.Thread(target=self._read, name="torchbay-template", daemon=True).start()

    @property
    def alive(self) -> bool:
        """Not known to be dead (the reader saw no EOF, the process has not exited)."""
        return not self.dead and self.proc.poll() is None

    @property
    def usable(self) -> bool:
        return self.ready.is_set() and self.alive

    def fork(self, env: Mapping[str, str], log_format: str) -> Spawned:
        """A worker forked on a new socketpair. Raises OSError when the template cannot."""
        reply, request_id = _Reply(), next(self._ids)
        with self._lock:
            if self.dead:
                raise OSError("the worker template exited")
            self._replies[request_id] = reply
        request = {"op": "fork", "id": request_id, "env": dict(env), "log_format": log_format}
        parent, child = socket.socketpair()
        try:  # with our stdout and stderr: where a spawned worker would write
            socket.send_fds(self.ctl, [json.dumps(request).encode()], [child.fileno(), 1, 2])
            if not reply.event.wait(FORK_REPLY_TIMEOUT_S):
                self._broken()
                raise OSError(f"the worker template did not fork in {FORK_REPLY_TIMEOUT_S:g}s")
            if reply.proc is None:
                raise OSError(reply.error)
        except BaseException:
            parent.close()
            with self._lock:
                self._replies.pop(request_id, None)
            raise
        finally:
            child.close()
        return Spawned(reply.proc, parent)  # type: ignore[arg-type]

    def _broken(self) -> None:
        """It did not answer a fork (stopped, hung): killed, so that the next worker's start
        replaces it instead of waiting for it again (its workers live on)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with self._lock:
            self.dead = True

    def _read(self) -> None:
        """Route the template's messages until it is gone; then fail what waits on it."""
        with contextlib.suppress(OSError, ValueError):
            while True:
                data, fds, _, _ = socket.recv_fds(self.ctl, 1 << 16, 1)
                if not data:
                    break
                self._route(json.loads(data), fds)
        with self._lock:
            self.dead = True
            replies, self._replies = list(self._replies.values()), {}
            procs, self._procs = list(self._procs.values()), {}
        self.settled.set()
        for reply in replies:
            reply.event.set()
        for proc in procs:
            proc.orphaned()
        self.ctl.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.proc.wait(timeout=30)  # reap it (it closed its socket: it is exiting)
            if code != 0 and not self.closing:
                log.warning("the worker template (pid %s) exited with code %s", self.proc.pid, code)

    def _route(self, message: dict, fds: list[int]) -> None:
        op = message.get("op")
        if op == "ready":
            self.ready.set()
            self.settled.set()
        elif op == "exit":
            with self._lock:
                proc = self._procs.pop(message["pid"], None)
            if proc is not None:
                proc.exited(int(message["code"]))
        elif op in ("forked", "error"):
            with self._lock:
                reply = self._replies.pop(message["id"], None)
                if op == "forked":
                    proc = ForkedProc(int(message["pid"]), fds.pop())
                    self._procs[proc.pid] = proc  # before its exit can be reported
            if reply is not None:
                reply.proc = proc if op == "forked" else None
                reply.error = message.get("error", reply.error)
                reply.event.set()
        for fd in fds:
            os.close(fd)

    def close(self, timeout: float = 10.0) -> None:
        """EOF to the template: it exits (its workers do not). One still importing torch has
        forked nothing and would read the EOF only once the import is done (seconds on a
        loaded host): it is terminated instead."""
        self.closing = True
        with contextlib.suppress(OSError):
            self.ctl.shutdown(socket.SHUT_RDWR)
        if not self.ready.is_set():
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkServer:
    """Forks workers from a template process; spawns them when it cannot (module docstring).

    ``start`` launches the template (non-blocking); ``spawn`` is the ``SpawnFn``; ``close`` ends
    the template. Counters say what happened: ``forks``, ``spawns`` (fallbacks), ``restarts``.
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        log_format: str = "text",
    ) -> None:
        self.env = worker_env(os.environ if env is None else env)
        self.python = python
        self.log_format = log_format  # the template's own lines (each worker gets its own)
        self._frozen = frozen_env(self.env)
        self._lock = threading.Lock()
        self._template: _Template | None = None
        self._closed = False
        self.forks = self.spawns = self.restarts = 0

    @classmethod
    def configured(
        cls,
        config: ServerConfig,
        env: Mapping[str, str] | None,
        early: EarlyTemplate | None = None,
    ) -> ForkServer | None:
        """The server's fork server for its ``worker_start`` setting (None: spawn every worker,
        as on a platform without fork or pidfds), with the template the CLI started ``early``
        (:meth:`adopt`)."""
        if not forks(config):
            return None
        visible = visible_env(os.environ if env is None else env, config.blacklist_env_vars)
        server = cls(visible, log_format=config.log_format)  # (the workers' /proc environ too)
        if early is not None:
            server.adopt(*early)
        return server

    def adopt(self, proc: subprocess.Popen, ctl: socket.socket, env: Mapping[str, str]) -> None:
        """Take a template started before the server's imports (server/early_workers.py, with
        ``env``, this python and log format) as this one's: ``start`` then keeps it. Closed
        instead when a fork of it would not be the worker this server spawns (``_same``)."""
        template = _Template(proc, ctl)
        if not self._same(env, self.python) or self._template is not None:
            template.close()
            return
        self._template = template

    def start(self) -> None:
        """Launch the template unless one is running (a dead one is replaced)."""
        with self._lock:
            current = self._template
            if self._closed or (current is not None and current.alive):
                return
            if current is not None:
                self.restarts += 1
                log.warning("the worker template is gone; starting another")
            try:
                self._template = _Template(
                    *start_worker(self.python, self.log_format, self.env, template=True)
                )
            except OSError as exc:
                log.warning("could not start the worker template: %r", exc)
                self._template = None

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the template can fork (tests, benchmarks); whether it can."""
        template = self._template
        return template is not None and template.settled.wait(timeout) and template.usable

    @property
    def pid(self) -> int | None:
        template = self._template
        return template.proc.pid if template is not None and not template.dead else None

    def spawn(
        self,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        log_format: str = "text",
    ) -> Spawned:
        """A worker: forked when the template can give the same one, else spawned. A template
        still starting is waited for (``TEMPLATE_START_WAIT_S``). Called in a thread."""
        env = os.environ if env is None else env
        template = self._template
        same = template is not None and self._same(env, python)
        if same and not template.settled.wait(TEMPLATE_START_WAIT_S):
            log.warning("the worker template is not up in %gs; spawning", TEMPLATE_START_WAIT_S)
        if same and template.usable:
            try:
                spawned = template.fork(worker_env(env), log_format)
            except OSError as exc:
                log.warning("forking a worker failed (%s); spawning it", exc)
            else:
                self.forks += 1
                return spawned
        if template is not None and not template.alive:
            # Restarted for the next worker: this one is spawned now, not after its import. (The
            # first template is the server's to start, before its start-up models.)
            self.start()
        self.spawns += 1
        return spawn_process(env, python, log_format)

    def _same(self, env: Mapping[str, str], python: str) -> bool:
        return python == self.python and frozen_env(env) == self._frozen

    def close(self) -> None:
        with self._lock:
            self._closed = True
            template, self._template = self._template, None
        if template is not None:
            template.close()
