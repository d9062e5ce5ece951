"""The writer side of ``torchbay serve``'s logging: the thread that writes what the event loop
queued, and the access line's fast path (see logs.py for the formats and the setup).

The event loop only formats a record and puts it on a ``queue.SimpleQueue``; :class:`Listener`
(a thread) writes it to the console and the log files. Two things keep a busy access log cheap
for the frontend, which shares the GIL with this thread:

* :class:`FastAccess`: access lines are formatted whole and the lines of one event-loop turn
  queued together as one :class:`Line` (one put, one time stamp), never built as
  ``LogRecord`` s nor passed down the handler chain, while our queue is the only way out (no
  ``--log-config`` handler, no filter on the way);
* :class:`Listener` wakes once per burst, not once per line: after the first record it lets the
  burst gather for ``GATHER_S``, then writes each run of access lines with one ``write`` per
  destination and flushes when the queue is dry.

The queue is bounded for the event loop (:class:`Records`): while the writer is
``MAX_QUEUED`` records behind (stderr a pipe that nobody reads, a stalled disk), a record is
dropped and counted rather than held, and the writer says how many once it writes again. The
event loop never waits on a log; the workers' output waits instead (``logfiles.MAX_BACKLOG``).

A log file rolls over daily and by size, as TorchServe's log4j2 configuration rolls its files
(rollover.py).

Torch-free; imports only rollover.py of ours.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import queue
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from torchbay.server.observe.rollover import RollingFile, Rotation

RecordFilter = Callable[[logging.LogRecord], bool]
BARRIER = "torchbay.logs.barrier"
# How long the writer lets a burst gather after its first record (a line's worst extra delay).
GATHER_S = 0.005
# Records the event loop may queue ahead of the writer; past it they are dropped and counted.
MAX_QUEUED = 10_000
DROPPED_LOGGER = "torchbay.logs"


class Records(queue.SimpleQueue):
    """The writer's queue: :meth:`offer` (the event loop's records) drops a record while
    ``limit`` are queued, counting it; ``put`` always queues (barriers, the stop, the workers'
    output, which waits for the writer before it puts)."""

    def __init__(self, limit: int = MAX_QUEUED) -> None:
        self.limit, self.dropped = limit, 0

    def offer(self, record: Any) -> None:
        if self.qsize() < self.limit:
            self.put(record)
        else:
            self.dropped += 1

    def take_dropped(self) -> int:
        """The records dropped since the last call."""
        dropped = self.dropped
        self.dropped -= dropped
        return dropped


class OwnedQueueHandler(logging.handlers.QueueHandler):
    """The root logger's one handler: formats in place instead of copying the record (no other
    handler sees it after this one) and offers it to :class:`Records`."""

    queue: Records

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        if len(logging.root.handlers) > 1:  # --log-config added one: it must see the original
            return super().prepare(record)
        record.msg = self.format(record)
        record.message = record.msg
        record.args = None
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        self.queue.offer(record)


class Line:
    """A line formatted whole by :class:`FastAccess`: what the writers read of a LogRecord."""

    __slots__ = ("msg", "name")
    levelno = logging.INFO

    def __init__(self, name: str, msg: str) -> None:
        self.name, self.msg = name, msg

    def getMessage(self) -> str:
        return self.msg


class FastAccess:
    """Queue an access line formatted whole, while nothing but our ``front`` handler would see
    its record (check :meth:`applies` first; otherwise log it the standard way)."""

    def __init__(
        self,
        logger: logging.Logger,
        front: logging.Handler,
        stamp: Callable[[float], str],
        records: Records,
    ) -> None:
        self._logger, self._front, self._stamp, self._put = logger, front, stamp, records.offer
        self._root = logging.getLogger()
        self._prefix = f" INFO {logger.name}: "

    def applies(self) -> bool:
        """Our handler alone on the root, none of the logger's own, no filter on the way
        (``--log-config`` and pytest's caplog add handlers: the standard path then)."""
        root, logger = self._root, self._logger
        return (
            len(root.handlers) == 1
            and root.handlers[0] is self._front
            and not logger.handlers
            and not logger.filters
            and not root.filters
            and not self._front.filters
            and logger.propagate
        )

    def put_all(self, messages: list[str]) -> None:
        """Queue ``messages`` as access lines with one time stamp, as one :class:`Line` (its
        ``msg`` the lines joined: the writers add the last newline)."""
        now = time.time()
        millis = int((now - int(now)) * 1000)
        head = f"{self._stamp(now)},{millis:03d}{self._prefix}"
        self._put(Line(self._logger.name, head + f"\n{head}".join(messages)))


def printable(text: str, limit: int | None = None) -> str:
    """``text`` for a log line: each character that is not printable (line breaks, ANSI
    escapes, other controls) written as its Python escape (``\\n``, ``\\x1b``); with ``limit``,
    its first ``limit`` characters only, then ``...(N more characters)``."""
    cut = ""
    if limit is not None and len(text) > limit:
        text, cut = text[:limit], f"...({len(text) - limit} more characters)"
    if text.isprintable():
        return text + cut
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text) + cut


def flush_quietly(handler: logging.Handler) -> None:
    """Write out what ``handler`` buffered; a write that fails (a full disk, a closed pipe)
    loses it: the writer thread, or the server's exit, goes on."""
    with contextlib.suppress(OSError, ValueError):
        logging.StreamHandler.flush(handler)  # type: ignore[arg-type]


def close_quietly(handler: logging.Handler) -> None:
    """Close ``handler``; what it could not write out (a full disk) is lost."""
    with contextlib.suppress(OSError, ValueError):
        handler.close()


class _IdleFlush:
    """A writer that flushes when the queue runs dry, not after every line, so a busy access
    log costs one write call per burst instead of one per request. The queue's handler did the
    formatting: the writer's format is the message."""

    _records: queue.SimpleQueue
    _failed = False  # a write failed (reported once)

    def _idle_flush(self, records: queue.SimpleQueue) -> None:
        self._records = records
        self.setFormatter(logging.Formatter("%(message)s"))  # type: ignore[attr-defined]

    def flush(self) -> None:
        if self._records.empty():
            super().flush()  # type: ignore[misc]

    def handleError(self, record: logging.LogRecord) -> None:
        """logging's report of a failed write (a traceback on stderr), once per destination:
        a full disk would otherwise print one per burst of lines."""
        if not self._failed:
            self._failed = True
            super().handleError(record)  # type: ignore[misc]


def stderr_stream() -> TextIO:
    """stderr for the writer thread. stderr is line-buffered (one write call per line): this
    one has its own buffer, which IdleFlushHandler flushes whenever the queue runs dry."""
    sys.stderr.flush()
    return open(sys.stderr.fileno(), "w", buffering=1 << 16, closefd=False)


class IdleFlushHandler(_IdleFlush, logging.StreamHandler):
    """The console writer."""

    def __init__(self, stream: TextIO, records: queue.SimpleQueue) -> None:
        super().__init__(stream)
        self._idle_flush(records)


class IdleFlushFile(_IdleFlush, RollingFile):
    """A log file, ``keep`` choosing its records."""

    def __init__(
        self, path: Path, records: queue.SimpleQueue, keep: RecordFilter | None, rotation: Rotation
    ) -> None:
        super().__init__(path, rotation)
        self._idle_flush(records)
        if keep is not None:
            self.addFilter(keep)


class Listener(logging.handlers.QueueListener):
    """The writer thread: bursts, :class:`Line` runs written whole, barrier records (flush
    every handler, then wake the waiter), and a line saying how many records were dropped."""

    queue: Records

    def __init__(
        self, records: Records, *handlers: logging.Handler, formatter: logging.Formatter
    ) -> None:
        super().__init__(records, *handlers)
        self.formatter = formatter

    def _monitor(self) -> None:
        records = self.queue
        while True:
            batch = [records.get()]
            if batch[0] is not self._sentinel:
                time.sleep(GATHER_S)  # let the burst gather: one wake-up, one write per burst
            while True:
                try:
                    batch.append(records.get_nowait())
                except queue.Empty:
                    break
            lines: list[Line] = []
            for record in batch:
                if type(record) is Line:
                    lines.append(record)
                    continue
                if lines:
                    self._write_lines(lines)
                    lines = []
                if record is self._sentinel:
                    return
                self.handle(record)
            if lines:
                self._write_lines(lines)
            self._say_dropped()

    def _say_dropped(self) -> None:
        if dropped := self.queue.take_dropped():
            message = (
                f"{dropped} log records dropped: the log writer was {self.queue.limit} records "
                "behind (a console or a log file that is not being written)"
            )
            record = logging.LogRecord(DROPPED_LOGGER, logging.WARNING, "", 0, message, None, None)
            record.msg, record.args = self.formatter.format(record), None
            self.handle(record)

    def handle(self, record: logging.LogRecord) -> None:
        if record.name != BARRIER:
            super().handle(record)
            return
        for handler in self.handlers:
            flush_quietly(handler)
        record.barrier.set()  # type: ignore[attr-defined]

    def _write_lines(self, lines: list[Line]) -> None:
        for handler in self.handlers:
            keep = handler.filter
            text = "".join([line.msg + "\n" for line in lines if keep(line)])  # type: ignore[arg-type]
            if not text:
                continue
            try:
                if isinstance(handler, RollingFile):
                    handler.write_text(text)
                else:
                    handler.stream.write(text)  # type: ignore[attr-defined]
                handler.flush()
            except Exception:  # a closed or broken stream: logging's own report
                handler.handleError(logging.makeLogRecord({"msg": text.rstrip("\n")}))
