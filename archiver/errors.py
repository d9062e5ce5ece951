"""The archiver's exception tree. Imports nothing of ours (the server imports it).

    ArchiveError                      base: every archiver failure; the CLI prints one line, exit 1
    ├── ArchiveArgumentError          bad options, a missing input file, an unknown handler
    ├── UnsafeMemberError             absolute path, ``..``, link or special member, duplicate name,
    │                                 a total, free-disk or compression-ratio limit passed
    ├── HashMismatchError             a member's sha256 differs from the manifest (or is unlisted)
    ├── CorruptArchiveError           not a readable zip / tar / archive directory
    ├── ManifestError                 MANIFEST.json missing or invalid
    ├── ConversionError               a format or precision cannot take the model (names the layer)
    └── ParityError                   the packed model drifts past the tolerance

Each error carries the offending ``member`` (or ``layer``) where there is one, so callers never
classify by message text.
"""

from __future__ import annotations

import lzma
import tarfile
import zipfile
import zlib

# What reading a damaged zip or tar raises besides the format's own error: zlib, lzma and gzip
# raise theirs (zlib.error and LZMAError are no OSError), a truncated gzip stream EOFError,
# zipfile NotImplementedError for a compression method or an encryption it does not read.
# Readers map all of them to CorruptArchiveError at the boundary.
UNREADABLE = (
    zipfile.BadZipFile,
    tarfile.TarError,
    OSError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    NotImplementedError,
)


class ArchiveError(Exception):
    """Base of every archiver error. ``str(exc)`` is one line a user can act on."""


class ArchiveArgumentError(ArchiveError):
    """Bad command-line options or a missing input file."""


class UnsafeMemberError(ArchiveError):
    """An archive member that extraction refuses to write."""

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(f"unsafe archive member {member!r}: {reason}")
        self.member = member
        self.reason = reason


class HashMismatchError(ArchiveError):
    """A member whose content does not match the manifest's sha256 (or is not listed at all)."""

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(f"archive member {member!r}: {reason}")
        self.member = member
        self.reason = reason


class CorruptArchiveError(ArchiveError):
    """The archive cannot be read (truncated zip, bad CRC, not an archive)."""


class ManifestError(ArchiveError):
    """MAR-INF/MANIFEST.json is missing or does not validate."""


class ConversionError(ArchiveError):
    """The requested format or precision cannot take this model; ``layer`` names the culprit."""

    def __init__(self, message: str, *, layer: str | None = None) -> None:
        super().__init__(message)
        self.layer = layer


class ParityError(ArchiveError):
    """The packed model's outputs drift past the tolerance; carries the measured numbers."""

    def __init__(self, message: str, *, parity: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.parity = parity or {}
