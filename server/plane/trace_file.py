"""Where Triton's trace extension writes its traces (``plane/trace.py``): the trace file, in
Triton's layout, written by one thread so that the event loop never waits on a disk.

Triton's layout for a trace file ``F``: a batch of traces written "to an index file" is a file of
its own, ``F.0``, ``F.1``, ... (one JSON array each; the index counts per file and starts at 0);
traces written to ``F`` itself continue one JSON array, opened by the first write and closed by
``close`` (the server stopping). A write that fails (a full disk, a missing directory, a path the
server may not write) is logged on ``torchbay.trace`` and its traces are lost: no request ever
waits on, or fails with, a trace file. The queue of writes is bounded: past it, traces are dropped
and counted in the log rather than held in memory without limit. Torch-free.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("torchbay.trace")
Job = tuple[str, Callable[..., None], tuple[str, ...]]  # (path, write, its arguments)
MAX_PENDING = 256  # writes queued for the thread; a slower disk drops traces past this
CLOSE_WAIT_S = 5.0  # how long the server's stop waits for the last writes


class TraceFile:
    """One trace file and its index files; every method but ``close`` returns at once."""

    def __init__(self, path: str, writer: Writer) -> None:
        self.path = path
        self._writer = writer
        self._index = 0  # the next index file's number (event-loop side)
        self._opened = False  # the plain file has its "[" (writer side)

    def write_indexed(self, traces: list[str]) -> None:
        """``traces`` (each one trace's JSON) as the next index file, ``path.<k>``."""
        name = f"{self.path}.{self._index}"
        self._index += 1
        self._writer.submit(name, _write_new, name, "[" + ",".join(traces) + "]")

    def append(self, traces: list[str]) -> None:
        """``traces`` appended to the array of the plain file (created by the first append)."""
        self._writer.submit(self.path, self._append, ",".join(traces))

    def close(self) -> None:
        """Close the plain file's array (when something was written to it)."""
        self._writer.submit(self.path, self._close)

    def _append(self, text: str) -> None:
        with open(self.path, "a" if self._opened else "w", encoding="utf-8") as f:
            f.write(("," if self._opened else "[") + text)
        self._opened = True

    def _close(self) -> None:
        if self._opened:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("]")
            self._opened = False


def _write_new(name: str, text: str) -> None:
    with open(name, "w", encoding="utf-8") as f:
        f.write(text)


class Writer:
    """One daemon thread running the trace file writes in the order they were submitted."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Job | None] = queue.Queue(MAX_PENDING)
        self._thread: threading.Thread | None = None
        self.dropped = 0  # writes refused because the queue was full

    def submit(self, path: str, write: Callable[..., None], *args: str) -> None:
        """Queue ``write(*args)`` (a write to ``path``) for the thread; dropped, and logged,
        when the queue is full."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="torchbay-trace", daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait((path, write, args))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning("trace file writes are behind: %d write(s) dropped", self.dropped)

    def close(self) -> None:
        """Run what is queued, then stop the thread (waiting ``CLOSE_WAIT_S`` at most)."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=CLOSE_WAIT_S)
        except queue.Full:
            log.warning("trace file writes are behind: the last traces are lost")
        self._thread.join(CLOSE_WAIT_S)
        self._thread = None

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            path, write, args = job
            try:
                write(*args)
            except (OSError, ValueError) as exc:  # the operator's path: logged, never raised
                reason = getattr(exc, "strerror", None) or exc
                log.error("could not write traces to %s: %s", path, reason)
