"""Log files that roll over as TorchServe's log4j2 configuration rolls its files.

TorchServe 0.12's ``log4j2.xml`` gives each file (``ts_log.log``, ``access_log.log``, ...) a
``SizeBasedTriggeringPolicy`` of 100 MB, a ``TimeBasedTriggeringPolicy`` and the file pattern
``<name>.%d{dd-MMM}.log.gz``: the file rolls over at its first write after local midnight, and
before it passes 100 MB, into ``ts_log.02-Dec.log.gz`` (the day it holds), gzipped. A file left
by an earlier day rolls over at the first write. :class:`RollingFile` does the same, with two
differences where log4j2's would lose lines or fill the disk (tests/data/torchserve/log_rollover
recorded it): a second archive of one day is ``ts_log.02-Dec.2.log.gz`` (log4j2, whose pattern
has no ``%i``, writes it over the first), and only the newest ``backups`` archives of a file are
kept (log4j2's ``max="5"`` counts an ``%i`` its pattern lacks: it never deletes a day's archive).

A file is renamed at once; the gzip (and the pruning) runs on one thread per file (log4j2
compresses asynchronously too), so a 100 MB file never stalls the writer. The gzip is written as
``<archive>.gz.part`` and renamed once whole: a ``.gz`` is never a cut one. What a server killed
in the middle of a gzip left is done again at the next start, and the ``ts_log.log.1`` ... of
torchbay before the daily names count among the archives kept. Torch-free; imports
nothing of ours.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import Any

# log4j2's %d{dd-MMM}: the day of the month and Java's English month abbreviation (never the
# locale's: a server's archive names do not change with LANG).
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

_PART = ".part"  # a .gz being written: renamed to its name once whole


@dataclass(frozen=True)
class Rotation:
    """When a log file rolls over: daily, and before a write would take it past ``max_bytes``
    (0: by day only); ``backups`` archives kept (0: none, the file starts over). ``clock`` is
    the time the day is read from (tests move it)."""

    max_bytes: int = 100 * 1024 * 1024
    backups: int = 5
    clock: Callable[[], float] = field(default=time.time, compare=False)

    @classmethod
    def of(cls, config: Any) -> Rotation:
        """The server config's ``log_file_max_bytes`` and ``log_file_backups``."""
        return cls(config.log_file_max_bytes, config.log_file_backups)


def day_name(stamp: float) -> str:
    """``02-Dec`` for a time on 2 December (local time), as log4j2's ``%d{dd-MMM}``."""
    day = time.localtime(stamp)
    return f"{day.tm_mday:02d}-{MONTHS[day.tm_mon - 1]}"


def next_midnight(stamp: float) -> float:
    """The local midnight that ends the day of ``stamp``."""
    day = time.localtime(stamp)
    return time.mktime((day.tm_year, day.tm_mon, day.tm_mday + 1, 0, 0, 0, 0, 0, -1))


def _size(path: Path) -> int:
    """The size of ``path``; 0 when it is gone (deleted under the server: nothing to archive)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class RollingFile(logging.FileHandler):
    """A log file (append mode, opened at once) that rolls over as ``rotation`` says, for a
    record (``emit``) or for text written whole (:meth:`write_text`); one that is not a regular
    file (a FIFO, a terminal, ``/dev/stdout``) is written and never rolled over."""

    def __init__(self, path: Path, rotation: Rotation) -> None:
        super().__init__(path, "a", encoding="utf-8")
        self.rotation = rotation
        self._stem = Path(self.baseFilename).name.removesuffix(".log")
        # Its archives: ``ts_log.02-Dec.log.gz`` (``.log`` until gzipped), and the ``ts_log.log.1``
        # ... that torchbay wrote before it rolled over daily: they count among the backups.
        self._archives = re.compile(
            rf"^{re.escape(self._stem)}\.(?:\d\d-[A-Z][a-z]{{2}}(\.\d+)?\.log(\.gz)?|log\.\d+)$"
        )
        self._pending: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._archiver: threading.Thread | None = None
        stat = os.fstat(self.stream.fileno())
        # Only a file rolls over: not a pipe, a terminal or /dev/stdout a log file links to.
        self.regular = S_ISREG(stat.st_mode)
        # A file that holds lines is of the day it was last written: an earlier day's rolls over.
        self._begin(stat.st_mtime if stat.st_size else rotation.clock())
        if self.regular:
            self._recover()

    def _begin(self, stamp: float) -> None:
        self._day, self._midnight = day_name(stamp), next_midnight(stamp)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write_text(self.format(record) + self.terminator)
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def write_text(self, text: str) -> None:
        """Append ``text``, rolling the file over first when a day ended since it began or it
        would pass ``max_bytes`` (a file that holds nothing yet is never rolled by size: one
        burst larger than the bound goes whole)."""
        if self.stream is None:  # closed by a rollover that failed to reopen
            self.stream = self._open()
        if not self.regular:
            self.stream.write(text)
            return
        now = self.rotation.clock()
        if now >= self._midnight:
            self.roll(now)
        elif self.rotation.max_bytes > 0:
            size = self.stream.tell()
            if size and size + len(text) > self.rotation.max_bytes:
                self.roll(now)
        self.stream.write(text)

    def doRollover(self) -> None:  # logging's name, for whoever calls it
        self.roll(self.rotation.clock())

    def roll(self, now: float) -> None:
        """Archive the file (an empty one is not archived) and start a new one at ``now``."""
        if self.stream is not None:
            self.stream.close()
            self.stream = None  # type: ignore[assignment]
        path = Path(self.baseFilename)
        try:
            if self.rotation.backups <= 0:
                path.write_bytes(b"")
            elif _size(path):
                target = self._free_name()
                os.replace(path, target)
                os.utime(target, (now, now))  # the order archives are pruned in
                self._archive(target)
        finally:  # a file deleted under the server, a folder gone: a new day all the same
            self._begin(now)
            self.stream = self._open()

    def _free_name(self) -> Path:
        """``<stem>.<day>.log``, or ``<stem>.<day>.<n>.log`` past the day's highest number when
        the day has archives already."""
        folder, prefix, numbers = Path(self.baseFilename).parent, f"{self._stem}.{self._day}.", [0]
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                named = self._archives.match(entry.name)
                if named and entry.name.startswith(prefix):
                    numbers.append(int(named[1][1:]) if named[1] else 1)
        n = max(numbers) + 1
        return folder / (prefix + (f"{n}." if n > 1 else "") + "log")

    def _archive(self, target: Path) -> None:
        """Have ``target`` gzipped, then the archives pruned, by this file's one archiving
        thread (started at the first rollover): a storm of rollovers queues, never a thread
        each."""
        self._pending.put(target)
        if self._archiver is None:
            self._archiver = threading.Thread(
                target=self._archive_all, name="torchbay-log-gzip", daemon=True
            )
            self._archiver.start()

    def _archive_all(self) -> None:
        while (target := self._pending.get()) is not None:
            gz = target.with_name(target.name + ".gz")
            part = gz.with_name(gz.name + _PART)  # a .gz is only ever a whole one
            try:
                with open(target, "rb") as src, gzip.open(part, "wb", compresslevel=6) as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                stat = target.stat()
                os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns))
                os.replace(part, gz)
                target.unlink()
            except OSError:  # a full disk (it stays uncompressed), pruned already (gone)
                part.unlink(missing_ok=True)
            self._prune()

    def _recover(self) -> None:
        """What a stop in the middle of a gzip left (the server killed): the ``.gz.part`` goes,
        and each archive still uncompressed is gzipped again, a ``.gz`` beside it replaced (one
        that torchbay before ``.part`` wrote in place may be cut short); then the archives are
        pruned (``ts_log.log.1`` ... of torchbay before the daily names among them)."""
        folder, left = Path(self.baseFilename).parent, []
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                name = entry.name
                if name.endswith(_PART) and self._archives.match(name.removesuffix(_PART)):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                elif name.endswith(".log") and self._archives.match(name):
                    left.append(folder / name)
        if self.rotation.backups <= 0:
            left = []  # none kept: pruned, not gzipped first
        for target in left:
            with contextlib.suppress(OSError):
                target.with_name(target.name + ".gz").unlink(missing_ok=True)
            self._archive(target)
        if not left:
            self._prune()

    def _prune(self) -> None:
        """Delete all but the newest ``backups`` archives of this file: by the time each was
        archived, then by its number in its day."""
        folder = Path(self.baseFilename).parent
        found = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                if named := self._archives.match(entry.name):
                    with contextlib.suppress(OSError):
                        number = int(named[1][1:]) if named[1] else 1
                        found.append((entry.stat().st_mtime_ns, number, entry.name))
        for *_, name in sorted(found)[: max(0, len(found) - self.rotation.backups)]:
            with contextlib.suppress(OSError):
                (folder / name).unlink()

    def close(self) -> None:
        """Close the file, then wait (bounded) for the archives being gzipped."""
        super().close()
        if self._archiver is not None:
            self._pending.put(None)
            self._archiver.join(60)
            self._archiver = None
