"""The frontend's handle on one worker process: spawn, handshake, one batch at a time, death.

States (``WorkerState``)::

    STARTING --Ready--> READY <--> BUSY --> DRAINING --> STOPPED
        |                  |        |
        +--LoadFailed/exit-+--------+--> FAILED

A worker becomes READY only on a ``Ready`` message (pid, device, load time). Death is seen from
the socket's EOF and the process's exit, never from logs. Torch-free.

Streaming: a batch's ``Part`` frames go to the ``on_part`` callback given to ``infer`` as they
arrive (before its ``Result``); ``response_timeout`` then bounds the wait for the next frame, not
the whole batch. ``cancel(request_id)`` tells the worker a client went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from torchbay.server.errors import RequestTimeout, TorchbayError, WorkerDied
from torchbay.server.serving import protocol as p
from torchbay.server.serving import spill, transport
from torchbay.server.serving.spawning import (
    Spawned,
    SpawnFn,
    end_group,
    spawn_off_loop,
    spawn_process,
)
from torchbay.server.serving.watchdog import FrameWatchdog

__all__ = ["SpawnFn", "Spawned", "WorkerLoadError", "WorkerProcess", "WorkerState", "spawn_process"]

log = logging.getLogger("torchbay.workers")

PartFn = Callable[[p.Part], None]  # a running batch's streamed parts, as they arrive
# A worker SIGTERMed (``WorkerProcess.stop``) has this long to exit before SIGKILL: a handler's
# own SIGTERM handler may clean up; the default action ends the process at once.
TERM_GRACE_S = 2.0


class WorkerState(enum.Enum):
    STARTING = "STARTING"
    READY = "READY"
    BUSY = "BUSY"
    DRAINING = "DRAINING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


class WorkerLoadError(TorchbayError):
    """The worker could not load its model (the handler's own error type and message)."""

    code = "model_load_failed"

    def __init__(self, message: str, *, error_type: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type

    @property
    def out_of_memory(self) -> bool:
        """The handler ran out of memory: Python's MemoryError, or torch's OutOfMemoryError
        (an accelerator's), as the worker names its type."""
        return self.error_type in ("MemoryError", "OutOfMemoryError")


class WorkerProcess:
    """One spawned worker. ``infer`` sends one batch and awaits its ``Result``."""

    _ids = itertools.count(1)

    def __init__(
        self,
        load: p.Load,
        *,
        name: str = "",
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        on_exit: Callable[[WorkerProcess], None] | None = None,
        log_format: str = "text",
        spawn: SpawnFn | None = None,
    ) -> None:
        self.load = load
        self.id = next(self._ids)
        self.name = name or f"W-{self.id}-{load.model_name}_{load.model_version}"
        self.env = dict(env) if env is not None else None
        self.python = python
        self.log_format = log_format
        self.on_exit = on_exit
        self.spawn = spawn or spawn_process
        self.state = WorkerState.STARTING
        self.pid: int | None = None
        self.device: str = "cpu" if load.gpu_id is None else f"cuda:{load.gpu_id}"
        self.load_time_ms: float | None = None
        # Intra-op threads the handler set itself while loading (Ready's count differs from the
        # Load's; a restarted slot's worker starts with its predecessor's): the host budget
        # counts them as configured and never re-tunes them.
        self.own_threads: int | None = None
        self.load_metrics: list[dict[str, Any]] = []  # the handler's, recorded while it loaded
        self.spill: spill.SpillReader | None = None  # the metrics of a batch it dies in
        self.start_time = time.time()
        self.exit_code: int | None = None
        self.batches = 0
        self.requests = 0  # requests sent to this worker (recycling counts them)
        self.rss_checked_at = 0.0  # loop time of the last RSS check (recycling)
        self._proc: subprocess.Popen | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._batch_ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[p.Result]] = {}
        self._on_part: dict[int, PartFn] = {}
        self.parts_seen = 0  # Part frames received (a streaming batch's progress)
        self.part_at = 0.0  # time.monotonic() of the last one
        self._tasks: set[asyncio.Task] = set()
        self.exited: asyncio.Future[int] | None = None

    @property
    def alive(self) -> bool:
        return self.state in (WorkerState.READY, WorkerState.BUSY, WorkerState.DRAINING)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, timeout: float, spawned: Spawned | None = None) -> p.Ready:
        """Spawn the process (or adopt a pre-warmed one), send ``Load``, wait for ``Ready``.

        Raises WorkerLoadError, or whatever spawning raised (OSError: EMFILE, ENOMEM, ...). On
        any failure, cancellation included, the worker is FAILED and its process killed.
        """
        self.exited = asyncio.get_running_loop().create_future()
        try:
            return await self._start(timeout, spawned)
        except asyncio.CancelledError:  # its slot retired (scaled down, unregistered, a stop)
            self.abort(WorkerState.STOPPED)  # our own kill: its exit is no failure to warn of
            raise
        except BaseException:
            self.abort()
            raise

    def abort(self, state: WorkerState = WorkerState.FAILED) -> None:
        """A start that did not finish: ``state`` (FAILED, or STOPPED when called off), the
        process killed; ``exited`` resolves."""
        self.state = state
        self.kill()
        if self._proc is None and self.exited is not None and not self.exited.done():
            self.exited.set_result(-1)  # nothing was spawned: nothing will ever exit

    async def _start(self, timeout: float, spawned: Spawned | None) -> p.Ready:
        loop = asyncio.get_running_loop()
        if spawned is None:  # in a thread: a fork server's answer must not stall the loop
            spawned = await spawn_off_loop(self.spawn, self.env, self.python, self.log_format)
        self._proc, parent = spawned.proc, spawned.sock
        self.pid = self._proc.pid
        log.debug("worker %s uses pid=%s", self.name, self.pid)
        self._watch_exit_in_thread(loop)
        self._reader, self._writer = await asyncio.open_unix_connection(sock=parent)
        self._writer.write(p.encode(self.load))
        try:
            message = await asyncio.wait_for(transport.read_message(self._reader), timeout)
        except asyncio.TimeoutError:
            self.kill()
            raise WorkerLoadError(f"worker {self.name} did not load within {timeout:g}s") from None
        except (asyncio.IncompleteReadError, ConnectionError):
            code = await self._exit_code()
            raise WorkerLoadError(
                f"worker {self.name} exited with code {code} while loading"
            ) from None
        if isinstance(message, p.LoadFailed):
            self.state = WorkerState.FAILED
            await self._exit_code()
            raise WorkerLoadError(message.message, error_type=message.error_type)
        if not isinstance(message, p.Ready):
            self.kill()
            raise WorkerLoadError(f"worker {self.name} sent {type(message).__name__} before Ready")
        self.pid, self.device, self.load_time_ms = message.pid, message.device, message.load_time_ms
        self.load_metrics = [m for m in message.metrics or () if isinstance(m, dict)]
        self.spill = spill.reader(message.metrics_spill)
        if message.num_threads != max(1, self.load.num_threads):
            self.own_threads = message.num_threads
        if self.load.gpu_id is not None and self.device == "cpu":
            log.warning(
                "worker %s was given GPU %d but runs on the CPU (no CUDA for torch there)",
                self.name,
                self.load.gpu_id,
            )
        self.state = WorkerState.READY
        self._spawn(self._read_results())
        log.debug("worker %s ready pid=%s device=%s", self.name, self.pid, self.device)
        return message

    async def infer(
        self,
        requests: list[p.WireRequest],
        timeout: float | None,
        on_part: PartFn | None = None,
    ) -> p.Result:
        """Run one batch; its streamed parts go to ``on_part``. Raises WorkerDied, or
        RequestTimeout (no frame within ``timeout``; the worker is killed)."""
        if not self.alive or self._writer is None:
            raise WorkerDied(f"worker {self.name} is not running")
        batch_id = next(self._batch_ids)
        future: asyncio.Future[p.Result] = asyncio.get_running_loop().create_future()
        self._pending[batch_id] = future
        if on_part is not None:
            self._on_part[batch_id] = on_part
        previous = self.state
        self.state = WorkerState.BUSY
        self.requests += len(requests)
        try:
            self._writer.write(p.encode(p.Infer(batch_id, requests)))
            if timeout is None:
                return await future
            watchdog = FrameWatchdog(self, future, timeout)
            try:
                return await future
            finally:
                watchdog.cancel()
        except asyncio.TimeoutError:
            log.error("worker %s did not answer within %gs; killing it", self.name, timeout)
            # Not alive from now on (the exit is observed later): no batch may reach it.
            self.state = WorkerState.FAILED
            self.kill()
            raise RequestTimeout(
                f"The model did not answer within {timeout:g}s; its worker is being restarted"
            ) from None
        finally:
            self._pending.pop(batch_id, None)
            self._on_part.pop(batch_id, None)
            self.batches += 1
            if self.state is WorkerState.BUSY:
                self.state = previous if previous is WorkerState.DRAINING else WorkerState.READY

    def cancel(self, request_id: str) -> None:
        """Tell the worker the client of ``request_id`` (in the running batch) went away."""
        self._tell(p.Cancel(request_id))

    def keep_regions(self, cuda: dict[str, list[Any]]) -> None:
        """Tell the worker which CUDA shared-memory regions are still registered: it closes the
        handles of any other (``p.Regions``)."""
        self._tell(p.Regions(cuda))

    async def stop(self, timeout: float = 5.0, *, busy: bool = False) -> None:
        """Ask the worker to exit (Shutdown), SIGTERM it once ``timeout`` passed, SIGKILL it
        ``TERM_GRACE_S`` later: at most ``timeout + TERM_GRACE_S``. A ``busy`` worker (still
        in a batch nobody waits for: a stuck handler) reads no Shutdown until its handler
        returns: SIGTERM at once. Idempotent."""
        proc = self._proc
        if proc is None or self.exit_code is not None:
            self._mark_stopped()
            return
        self.state = WorkerState.DRAINING if self.alive else self.state
        if self._writer is not None and not self._writer.is_closing():
            with contextlib.suppress(ConnectionError, RuntimeError):
                self._writer.write(p.encode(p.Shutdown()))
        stages = ((proc.terminate, TERM_GRACE_S), (proc.kill, TERM_GRACE_S))
        if not busy:
            stages = ((None, timeout), *stages)
        for action, wait in stages:  # Shutdown, then SIGTERM, then SIGKILL
            if action is not None:
                with contextlib.suppress(ProcessLookupError):
                    action()
            try:
                await asyncio.wait_for(asyncio.shield(self._exit_code()), wait)
                break
            except asyncio.TimeoutError:
                continue
        self._mark_stopped()

    def tune(self, num_threads: int, cpu_affinity: list[int] | None = None) -> None:
        """Change the worker's torch threads (and cores); it applies them before its next batch."""
        if self._tell(p.Tune(num_threads, cpu_affinity)):
            self.load = replace(self.load, num_threads=num_threads, cpu_affinity=cpu_affinity)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGKILL)

    # -- internals ----------------------------------------------------------------------------

    def _tell(self, message: p.Message) -> bool:
        """Write ``message`` to a running worker, beside or between its batches; False (nothing
        written) when it is not running."""
        if not self.alive or self._writer is None or self._writer.is_closing():
            return False
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._writer.write(p.encode(message))
        return True

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _exit_code(self) -> int:
        assert self.exited is not None
        return await self.exited

    def _watch_exit_in_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for the process in a thread (Popen.wait) and report back on the loop."""
        proc = self._proc
        assert proc is not None

        def wait() -> None:
            if isinstance(proc, subprocess.Popen):  # a forked one's template ends its group
                with contextlib.suppress(OSError):  # exited, not reaped: the pid is still its
                    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
                end_group(proc.pid)
            code = proc.wait()
            with contextlib.suppress(RuntimeError):  # the loop may be closed at exit
                loop.call_soon_threadsafe(self._on_exit, code)

        threading.Thread(target=wait, name=f"wait-{self.name}", daemon=True).start()

    def _on_exit(self, code: int) -> None:
        assert self.exited is not None
        self.exit_code = code
        if self.state is not WorkerState.STOPPED:
            if self.state is not WorkerState.DRAINING:
                log.warning("worker %s (pid %s) exited with code %s", self.name, self.pid, code)
            self.state = (
                WorkerState.STOPPED if self.state is WorkerState.DRAINING else WorkerState.FAILED
            )
        self._fail_pending(code)
        if self._writer is not None:
            self._writer.close()
        if not self.exited.done():
            self.exited.set_result(code)
        if self.on_exit is not None:
            self.on_exit(self)

    async def _read_results(self) -> None:
        assert self._reader is not None
        try:
            while True:
                message = await transport.read_message(self._reader)
                if isinstance(message, p.Part):
                    self._part(message)
                    continue
                if not isinstance(message, p.Result):
                    raise p.ProtocolError(f"unexpected {type(message).__name__} from worker")
                future = self._pending.get(message.batch_id)
                if future is not None and not future.done():
                    future.set_result(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # EOF: the process is exiting; _watch_exit finishes the job
        except p.ProtocolError:
            log.error("worker %s broke the protocol; killing it", self.name, exc_info=True)
            self.kill()

    def _part(self, part: p.Part) -> None:
        self.parts_seen += 1
        self.part_at = time.monotonic()
        on_part = self._on_part.get(part.batch_id)
        if on_part is not None:
            on_part(part)

    def _fail_pending(self, code: int | None) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(
                    WorkerDied(f"The worker serving this request died (exit code {code})")
                )

    def _mark_stopped(self) -> None:
        if self.state is not WorkerState.FAILED:
            self.state = WorkerState.STOPPED
