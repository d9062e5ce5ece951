"""``bench sla --apply``: the winner's settings into an archive's ``model-config.yaml`` (other
keys kept; comments lost, as PyYAML does not round-trip them), through the archiver's checked
extraction and atomic writer, with the manifest's hash updated, so the next serve uses them."""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from functools import partial
from pathlib import Path

import yaml

from torchbay.archiver.extract import extract_archive, sha256_file
from torchbay.archiver.write import ArchiveFormat, write_archive
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.scenarios import Batching


def _archive_format(path: Path) -> ArchiveFormat:
    if path.is_dir():
        return "no-archive"
    if not zipfile.is_zipfile(path):
        return "tgz"
    with zipfile.ZipFile(path) as zf:
        stored = all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
    return "zip-store" if stored else "default"


def backup_path(archive: Path) -> Path:
    """Where the original goes before ``apply_settings`` rewrites it: ``x.mar.orig`` (a name no
    model store loads), or ``x.mar.orig.N`` when an earlier backup is there."""
    candidate, n = archive.with_name(archive.name + ".orig"), 0
    while candidate.exists():
        n += 1
        candidate = archive.with_name(f"{archive.name}.orig.{n}")
    return candidate


def apply_settings(archive: str | Path, settings: Batching) -> Path:
    """Rewrite ``archive`` in place with ``settings`` in its model-config.yaml, after copying the
    original to ``backup_path(archive)``; returns the backup's path.
    Raises BenchError (or the archiver's ArchiveError) when it cannot be read or written."""
    archive = Path(archive)
    fmt = _archive_format(archive)
    with tempfile.TemporaryDirectory(prefix="tb-apply-") as work:
        root = Path(work) / "x"
        manifest = extract_archive(archive, root)
        name = manifest.model.config_file or "model-config.yaml"
        config_path = root / name
        data = (yaml.safe_load(config_path.read_text()) if config_path.is_file() else None) or {}
        if not isinstance(data, dict):
            raise BenchError(f"{archive}:{name} is not a YAML mapping")
        # The settings' keys set, the others untouched, their order kept.
        config_path.write_text(yaml.safe_dump({**data, **settings.keys()}, sort_keys=False))
        update = {"model": manifest.model.model_copy(update={"config_file": name})}
        if manifest.torchbay is not None:
            files = {**manifest.torchbay.files, name: sha256_file(config_path)}
            update["torchbay"] = manifest.torchbay.model_copy(update={"files": files})
        # For a .tar.gz the name is the top folder TorchServe expects: the model's name.
        files = {
            path.relative_to(root).as_posix(): path
            for path in sorted(root.rglob("*"))
            if path.is_file() and not path.relative_to(root).as_posix().startswith("MAR-INF/")
        }
        try:
            copy = partial(shutil.copytree, symlinks=True) if archive.is_dir() else shutil.copy2
            backup = copy(archive, backup_path(archive))
        except OSError as exc:  # a read-only model store: the archive is left as it was
            raise BenchError(f"--apply: cannot keep the original beside it: {exc}") from None
        new_manifest = manifest.model_copy(update=update)
        write_archive(fmt, archive, files, new_manifest, manifest.model.model_name)
    return backup
