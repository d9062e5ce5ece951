"""Writing an archive: ``<name>.mar`` (deflated or stored zip), ``<name>.tar.gz`` or a ``<name>/``
folder, built next to its destination and moved into place (never a half-written archive).

Split out of ``package.py``; ``benchmarks/apply.py`` rewrites archives through it too.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from torchbay.archiver.errors import ArchiveError
from torchbay.archiver.manifest import MANIFEST_PATH, Manifest

ArchiveFormat = Literal["default", "zip-store", "no-archive", "tgz"]


def write_archive(
    fmt: ArchiveFormat, out: Path, files: Mapping[str, Path], manifest: Manifest, name: str
) -> None:
    """Write ``files`` (archive name -> source path) and ``manifest`` as an archive of format
    ``fmt`` next to ``out``, then move it into place (never a half-written archive). ``name`` is
    the model name (the top folder of a tgz)."""
    manifest_bytes = manifest.to_json().encode()
    try:
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    except OSError as exc:
        raise ArchiveError(f"cannot write {out}: {exc.strerror or exc}") from None
    try:
        if fmt == "no-archive":
            target = _write_folder(tmp_dir / name, files, manifest_bytes)
            if out.exists():
                shutil.rmtree(out) if out.is_dir() else out.unlink()
        else:
            target = tmp_dir / out.name
            if fmt == "tgz":
                _write_tgz(target, files, manifest_bytes, name)
            else:
                _write_zip(target, files, manifest_bytes, stored=fmt == "zip-store")
            if out.is_dir():
                shutil.rmtree(out)
        os.replace(target, out)
    except OSError as exc:
        raise ArchiveError(f"cannot write {out}: {exc}") from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _write_folder(target: Path, files: Mapping[str, Path], manifest_bytes: bytes) -> Path:
    for arcname, src in files.items():
        dst = target / arcname
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    (target / "MAR-INF").mkdir(parents=True, exist_ok=True)
    (target / MANIFEST_PATH).write_bytes(manifest_bytes)
    return target


def _write_tgz(target: Path, files: Mapping[str, Path], manifest_bytes: bytes, name: str) -> None:
    with tarfile.open(target, "w:gz") as tf:
        for arcname, src in sorted(files.items()):
            tf.add(src, arcname=f"{name}/{arcname}", recursive=False)
        info = tarfile.TarInfo(f"{name}/{MANIFEST_PATH}")
        info.size = len(manifest_bytes)
        tf.addfile(info, io.BytesIO(manifest_bytes))


def _write_zip(
    target: Path, files: Mapping[str, Path], manifest_bytes: bytes, *, stored: bool
) -> None:
    mode = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(target, "w", mode) as zf:
        for arcname, src in sorted(files.items()):
            zf.write(src, arcname)
        zf.writestr(MANIFEST_PATH, manifest_bytes)
