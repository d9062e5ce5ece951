"""The limits of archive unpacking: the expanded total, the free disk space and the compression
ratio (see ``extract``'s docstring for the defaults and why). ``Budget`` counts the bytes one
unpacking writes and raises ``UnsafeMemberError`` naming the member before a limit is passed.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import IO

from torchbay.archiver.errors import UnsafeMemberError

DEFAULT_MAX_TOTAL_BYTES = 64 << 30
DEFAULT_MAX_RATIO = 100.0
# Members (and archives) that expand to less than this are not held to the ratio.
RATIO_FLOOR_BYTES = 1 << 20
CHUNK = 1 << 20


def free_bytes(folder: Path) -> int:
    """Free disk space where ``folder`` is (or would be created)."""
    for candidate in (folder, *folder.parents):
        if candidate.is_dir():
            return shutil.disk_usage(candidate).free
    return shutil.disk_usage(".").free


class Budget:
    """Counts expanded bytes; raises before the total, the free space or the ratio is passed.

    ``archive_bytes`` is the compressed archive's size (None for a directory: no ratio).
    """

    def __init__(
        self,
        max_total: int,
        max_ratio: float = DEFAULT_MAX_RATIO,
        *,
        archive_bytes: int | None = None,
        free: int | None = None,
    ) -> None:
        self.max_total = max_total
        self.max_ratio = max_ratio
        self.archive_bytes = archive_bytes
        self.free = free
        self.total = 0

    def _check_total(self, name: str, total: int, verb: str) -> None:
        if total > self.max_total:
            raise UnsafeMemberError(
                name, f"archive {verb} {total} bytes, over the limit of {self.max_total} bytes"
            )
        if self.free is not None and total > self.free:
            raise UnsafeMemberError(
                name, f"archive {verb} {total} bytes, more than the {self.free} bytes free on disk"
            )
        if (
            self.archive_bytes is not None
            and total > RATIO_FLOOR_BYTES
            and total > self.archive_bytes * self.max_ratio
        ):
            raise UnsafeMemberError(
                name,
                f"archive {verb} {total} bytes from {self.archive_bytes}: compression ratio "
                f"over the limit of {self.max_ratio:g}",
            )

    def _check_ratio(self, name: str, size: int, compressed: int | None, verb: str) -> None:
        if compressed is None or size <= RATIO_FLOOR_BYTES:
            return
        if size > max(compressed, 1) * self.max_ratio:
            raise UnsafeMemberError(
                name,
                f"{verb} {size} bytes from {compressed}: compression ratio over the limit "
                f"of {self.max_ratio:g}",
            )

    def declare(
        self, name: str, size: int, declared_total: int, compressed: int | None = None
    ) -> None:
        """Check a member's declared size (and the running declared total) before writing."""
        self._check_ratio(name, size, compressed, "declares")
        self._check_total(name, declared_total, "declares")

    def copy(self, name: str, src: IO[bytes], dst: IO[bytes], compressed: int | None = None) -> str:
        """Copy ``src`` to ``dst`` counting bytes; returns the sha256 of what was written."""
        digest = hashlib.sha256()
        written = 0
        while chunk := src.read(CHUNK):
            written += len(chunk)
            self.total += len(chunk)
            self._check_ratio(name, written, compressed, "expands past")
            self._check_total(name, self.total, "expands past")
            digest.update(chunk)
            dst.write(chunk)
        return digest.hexdigest()
