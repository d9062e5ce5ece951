"""The metrics spill: a handler's metric records of the running batch, where the frontend can read
them when the worker dies before the batch's ``Result`` (``os._exit``, a segfault, a kill after
``response_timeout``). TorchServe's backend writes each record as a line to the worker's stdout,
which its frontend parses as it comes, so what a handler recorded before its worker died is
published; here records ride back with the ``Result``, and the spill keeps that promise.

A file the worker creates (``mkstemp``, 0600, written out: a sparse file's page first written in
the map on a full filesystem would kill it with SIGBUS) and maps, named in its ``Ready``; the
frontend opens it and unlinks it at once, keeping the descriptor (it reads with ``pread``: no
mapping of its own that a truncated file could fault). Layout: a u32 count of bytes used at offset
0, the records from ``START`` as JSON lines. The worker writes a record's line, then the count (a
record is there whole or not at all), and sets the count to 0 when the batch's records are drained
into its ``Result``: a memory write per record, no system call, and nothing on the frontend's side
until a batch fails with its worker. Past ``SIZE``, records are not spilled (they still ride back
with a ``Result``). Torch-free.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import tempfile
from typing import Any

SIZE = 1 << 16  # 64 KiB: some 400 records of one batch
START = 8
_USED = struct.Struct("=I")


class SpillWriter:
    """The worker's side: ``add`` each record, ``clear`` when the batch's are drained."""

    def __init__(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="torchbay-metrics-")
        try:
            with open(fd, "wb", closefd=False) as handle:
                handle.write(bytes(SIZE))  # OSError (ENOSPC) here: no spill, said once
            self._map = mmap.mmap(fd, SIZE)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        self._used = 0
        self._full = False  # a record did not fit: none is encoded until the next clear

    def add(self, record: dict[str, Any]) -> None:
        if self._full:
            return
        try:
            line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        except (TypeError, ValueError):
            return
        end = START + self._used + len(line)
        if end > SIZE:
            self._full = True
            return
        self._map[START + self._used : end] = line
        self._used = end - START
        _USED.pack_into(self._map, 0, self._used)

    def clear(self) -> None:
        self._full = False
        if self._used:
            self._used = 0
            _USED.pack_into(self._map, 0, 0)


class SpillReader:
    """The frontend's side of a worker's spill (``path`` from its ``Ready``), unlinked here."""

    def __init__(self, path: str) -> None:
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)  # never waits on a FIFO
        self._fd: int | None = os.open(path, flags)
        with contextlib.suppress(OSError):
            os.unlink(path)

    def take(self) -> list[dict[str, Any]]:
        """The records of the batch the worker was running, once (the file is closed after)."""
        if self._fd is None:
            return []
        try:
            raw = os.pread(self._fd, SIZE, 0)
        except OSError:
            raw = b""
        finally:
            os.close(self._fd)
            self._fd = None
        used = _USED.unpack_from(raw, 0)[0] if len(raw) >= START else 0
        records = []
        for line in raw[START : START + used].splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    records.append(record)
        return records

    def __del__(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)


def reader(path: str) -> SpillReader | None:
    """The spill a worker's ``Ready`` named (None when it named none or it cannot be mapped)."""
    if not os.path.basename(path).startswith("torchbay-metrics-"):
        return None  # none named, or not one of SpillWriter's files
    try:
        return SpillReader(path)
    except (OSError, ValueError):
        return None
