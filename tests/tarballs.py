"""Shared by the hostile-archive tests (tests/archiver/test_manifest_extract.py and
tests/server/test_hostile_archives.py): .tar.gz archives written member by member."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path


def write_tar_with_link(
    path: Path, top: str, manifest: str, link_type: bytes, target: str = "/etc/passwd"
) -> Path:
    """``path``: a .tar.gz of ``top/MAR-INF/MANIFEST.json`` (``manifest``) and ``top/model.pt``,
    a link of ``link_type`` (``tarfile.SYMTYPE`` or ``tarfile.LNKTYPE``) to ``target``."""
    data = manifest.encode()
    with tarfile.open(path, "w:gz") as tf:
        info = tarfile.TarInfo(f"{top}/MAR-INF/MANIFEST.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(f"{top}/model.pt")
        link.type = link_type
        link.linkname = target
        tf.addfile(link)
    return path
