"""The one seam through which the server uses the archiver (``torchbay.archiver``).

The registry reads an archive's manifest, extracts it under the server's limits (expanded size,
compression ratio) and checks names with what is re-exported here, and nothing else of the
archiver. ``ArchiveError`` is what every one of them raises on a bad archive (the registry
answers it 400). Torch-free: the archiver's reading side does not import torch.
"""

from __future__ import annotations

from torchbay.archiver.errors import ArchiveError
from torchbay.archiver.extract import extract_archive
from torchbay.archiver.manifest import (
    Manifest,
    is_valid_model_name,
    is_valid_model_version,
    read_manifest,
    safe_relpath,
)

__all__ = [
    "ArchiveError",
    "Manifest",
    "extract_archive",
    "is_valid_model_name",
    "is_valid_model_version",
    "read_manifest",
    "safe_relpath",
]
