"""Safe unpacking of TorchServe workflow archives (``.war``, made by torch-workflow-archiver).

A ``.war`` is a zip of the workflow's spec (YAML), its handler (the function nodes) and extra
files, with ``WAR-INF/MANIFEST.json``. It is unpacked with the same member checks and limits as a
model archive (``extract.py``: no absolute paths, ``..``, links or special files, no duplicate or
encrypted members, the expanded total and compression ratio under the limits, counted while
writing), and its manifest is read with a size cap. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchbay.archiver.errors import ManifestError
from torchbay.archiver.extract import (
    _cleanup_on_error,
    _Writer,
    checked_zip_members,
    open_zip,
    write_zip_members,
)
from torchbay.archiver.limits import DEFAULT_MAX_RATIO, DEFAULT_MAX_TOTAL_BYTES, Budget, free_bytes
from torchbay.archiver.manifest import MAX_MANIFEST_BYTES, json_object

WAR_MANIFEST = "WAR-INF/MANIFEST.json"


def extract_war(
    path: str | Path,
    dest_dir: str | Path,
    *,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_ratio: float = DEFAULT_MAX_RATIO,
) -> dict[str, Any]:
    """Unpack the workflow archive ``path`` into ``dest_dir`` (created; must be empty) and return
    its manifest as a dict ({} when it has none, as TorchServe reads it). On any failure the
    destination is left empty and an ArchiveError subclass names the offending member."""
    src, dest = Path(path), Path(dest_dir)
    budget = Budget(
        max_total_bytes, max_ratio, archive_bytes=src.stat().st_size, free=free_bytes(dest)
    )
    with _cleanup_on_error(dest):
        with open_zip(src) as zf:
            files = checked_zip_members(zf, budget)
            write_zip_members(zf, files, _Writer(dest, None, budget), src.name)
        return _manifest(dest, src.name)


def _manifest(dest: Path, source: str) -> dict[str, Any]:
    path = dest / WAR_MANIFEST
    if not path.is_file():
        return {}
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{source}: {WAR_MANIFEST} is too large")
    return json_object(path.read_bytes(), f"{source}:{WAR_MANIFEST}")
