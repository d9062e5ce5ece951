"""Hostile archives, unit level (torch-free): traversal in manifest fields, zip and tar bombs
(declared and lying sizes), links and absolute members. Each is refused before anything lands
outside the destination, and the destination is left empty."""

from __future__ import annotations

import io
import json
import os
import stat
import struct
import tarfile
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

from torchbay.archiver.errors import (
    ArchiveError,
    CorruptArchiveError,
    ManifestError,
    UnsafeMemberError,
)
from torchbay.archiver.extract import extract_archive
from torchbay.archiver.manifest import (
    handler_spec_problem,
    is_valid_model_name,
    is_valid_model_version,
    parse_manifest,
)

MIB = 1 << 20
SMALL = {"max_total_bytes": 20 * MIB, "max_ratio": 100.0}


def manifest(**model: Any) -> str:
    fields = {"modelName": "m", "modelVersion": "1.0", "handler": "tensor", **model}
    return json.dumps({"runtime": "python", "model": fields})


def write_zip(path: Path, members: dict[str, bytes], man: str | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("MAR-INF/MANIFEST.json", man or manifest())
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def write_tgz(path: Path, members: dict[str, bytes], top: str = "m") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in {"MAR-INF/MANIFEST.json": manifest().encode(), **members}.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def lie_about_sizes(path: Path, member: str, declared: int) -> None:
    """Patch the local and central headers of ``member`` to declare ``declared`` bytes."""
    raw = bytearray(path.read_bytes())
    name = member.encode()
    for sig, size_at, name_at in ((b"PK\x03\x04", 22, 30), (b"PK\x01\x02", 24, 46)):
        start = 0
        while (at := raw.find(sig, start)) >= 0:
            start = at + 4
            if raw[at + name_at : at + name_at + len(name)] == name:
                raw[at + size_at : at + size_at + 4] = struct.pack("<I", declared)
    path.write_bytes(bytes(raw))


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("modelVersion", "../../x"),
        ("modelVersion", "1.0\n"),
        ("modelVersion", "1/0"),
        ("modelName", "a/b"),
        ("modelName", "m\n"),
        ("modelName", ".."),
        ("serializedFile", "/etc/passwd"),
        ("serializedFile", "../outside.pt"),
        ("handler", "../evil.py"),
        ("handler", "/tmp/evil.py:handle"),
        ("handler", "evil.py:not a name"),
        ("modelFile", "sub/../../model.py"),
        ("configFile", "../../model-config.yaml"),
        ("requirementsFile", "C:\\req.txt"),
        ("extraFiles", ["ok.txt", "../../etc/shadow"]),
        ("extensions", ["/abs/ext.so"]),
    ],
)
def test_manifest_fields_that_become_paths_are_refused(field: str, value: Any) -> None:
    with pytest.raises(ManifestError, match=field if field.startswith("model") else "archive"):
        parse_manifest(manifest(**{field: value}))


def test_safe_names_versions_and_handler_specs_still_pass() -> None:
    for version in ("1.0", "2", "1.0.0-rc1", "2.1+cu121"):
        assert is_valid_model_version(version)
    for name in ("resnet-18", "bert_base.v2", "A1"):
        assert is_valid_model_name(name)
    assert not is_valid_model_name("x" * 200)
    for spec in (
        "image_classifier",
        "ts.torch_handler.image_classifier",
        "handler.py",
        "handler.py:handle",
        "custom:entry_point",
        "sub/handler.py",
    ):
        assert handler_spec_problem(spec) is None, spec
    m = parse_manifest(manifest(serializedFile="w/model.pt", handler="handler.py:handle"))
    assert m.model.serialized_file == "w/model.pt"


def test_zip_bomb_refused_from_declared_sizes(tmp_path: Path) -> None:
    # Four members of zeros, each 8 MiB (under the 20 MiB total), compressing ~1000x.
    mar = write_zip(tmp_path / "bomb.mar", {f"w{i}.bin": bytes(8 * MIB) for i in range(4)})
    assert mar.stat().st_size < 200_000
    with pytest.raises(UnsafeMemberError, match=r"w0.bin.*compression ratio"):
        extract_archive(mar, tmp_path / "out", **SMALL)
    assert not (tmp_path / "out").exists()
    # With no ratio limit the total still stops it, again before writing anything.
    with pytest.raises(UnsafeMemberError, match=r"over the limit of 20971520 bytes"):
        extract_archive(mar, tmp_path / "out", max_total_bytes=20 * MIB, max_ratio=1e6)
    assert not (tmp_path / "out").exists()


def test_zip_bomb_with_lying_headers_writes_nothing_big(tmp_path: Path) -> None:
    mar = write_zip(tmp_path / "liar.mar", {"w.bin": bytes(64 * MIB)})
    lie_about_sizes(mar, "w.bin", 1000)
    assert zipfile.ZipFile(mar).getinfo("w.bin").file_size == 1000  # the lie is in place
    with pytest.raises((UnsafeMemberError, CorruptArchiveError), match=r"w.bin"):
        extract_archive(mar, tmp_path / "out", **SMALL)
    assert not (tmp_path / "out").exists()


def test_many_small_members_bomb_is_refused_by_the_archive_ratio(tmp_path: Path) -> None:
    # 40 members of 1 MiB (each under the 1 MiB ratio floor): the archive as a whole is held to it.
    mar = write_zip(tmp_path / "many.mar", {f"w{i}.bin": bytes(MIB) for i in range(40)})
    with pytest.raises(UnsafeMemberError, match=r"compression ratio"):
        extract_archive(mar, tmp_path / "out", max_total_bytes=1 << 30, max_ratio=100.0)
    assert not (tmp_path / "out").exists()


def test_tar_bomb_is_refused(tmp_path: Path) -> None:
    tgz = write_tgz(tmp_path / "bomb.tar.gz", {f"w{i}.bin": bytes(8 * MIB) for i in range(4)})
    with pytest.raises(UnsafeMemberError, match=r"compression ratio"):
        extract_archive(tgz, tmp_path / "out", **SMALL)
    with pytest.raises(UnsafeMemberError, match=r"over the limit"):
        extract_archive(tgz, tmp_path / "out", max_total_bytes=20 * MIB, max_ratio=1e6)
    assert not (tmp_path / "out").exists()


def test_no_per_member_cap_only_the_total(tmp_path: Path) -> None:
    # One incompressible member holding nearly all of a small total loads (the old code capped
    # each member separately, which broke multi-GB checkpoints); one byte more does not.
    weights = os.urandom(3 * MIB)
    mar = write_zip(tmp_path / "big.mar", {"weights.bin": weights})
    total = sum(i.file_size for i in zipfile.ZipFile(mar).infolist())
    extract_archive(mar, tmp_path / "ok", max_total_bytes=total, max_ratio=100.0)
    assert (tmp_path / "ok" / "weights.bin").read_bytes() == weights
    with pytest.raises(UnsafeMemberError, match=r"over the limit"):
        extract_archive(mar, tmp_path / "no", max_total_bytes=total - 1, max_ratio=100.0)
    tgz = write_tgz(tmp_path / "big.tar.gz", {"weights.bin": weights})
    extract_archive(tgz, tmp_path / "ok-tgz", max_total_bytes=4 * MIB, max_ratio=100.0)
    assert (tmp_path / "ok-tgz" / "weights.bin").read_bytes() == weights


def test_expanded_size_over_free_disk_is_refused(tmp_path: Path, monkeypatch) -> None:
    # The free-space probe is the one I/O seam faked here (a full disk cannot be made in a test).
    import torchbay.archiver.extract as extract

    full = types.SimpleNamespace(total=10**9, used=10**9 - 1000, free=1000)
    monkeypatch.setattr(extract.shutil, "disk_usage", lambda path: full)
    mar = write_zip(tmp_path / "m.mar", {"a.bin": b"x" * 5000})
    with pytest.raises(UnsafeMemberError, match=r"free on disk"):
        extract_archive(mar, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _zip_link(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", manifest())
        info = zipfile.ZipInfo("model.pt")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    return path


def _zip_absolute(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", manifest())
        zf.writestr(zipfile.ZipInfo("/tmp/evil.py"), b"x")
    return path


def _tar_with(path: Path, member: tarfile.TarInfo, data: bytes | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        man = manifest().encode()
        info = tarfile.TarInfo("m/MAR-INF/MANIFEST.json")
        info.size = len(man)
        tf.addfile(info, io.BytesIO(man))
        tf.addfile(member, io.BytesIO(data) if data is not None else None)
    return path


def _tar_link(kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo("m/model.pt")
    info.type = kind
    info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else "m/MAR-INF/MANIFEST.json"
    return info


def _tar_absolute() -> tarfile.TarInfo:
    info = tarfile.TarInfo("/tmp/evil.py")
    info.size = 1
    return info


@pytest.mark.parametrize(
    ("build", "why"),
    [
        (lambda p: _zip_link(p / "a.mar"), "symlink"),
        (lambda p: _zip_absolute(p / "a.mar"), "absolute"),
        (lambda p: _tar_with(p / "a.tar.gz", _tar_link(tarfile.SYMTYPE)), "link"),
        (lambda p: _tar_with(p / "a.tar.gz", _tar_link(tarfile.LNKTYPE)), "link"),
        (lambda p: _tar_with(p / "a.tar.gz", _tar_absolute(), b"x"), "absolute"),
    ],
)
def test_link_and_absolute_members_are_refused(tmp_path: Path, build, why: str) -> None:
    archive = build(tmp_path)
    before = tree(tmp_path)
    with pytest.raises(UnsafeMemberError, match=why):
        extract_archive(archive, tmp_path / "out")
    assert tree(tmp_path) == before  # nothing written anywhere


def test_error_messages_name_the_member_not_the_absolute_path(tmp_path: Path) -> None:
    garbage = tmp_path / "g.mar"
    garbage.write_bytes(b"not an archive")
    no_manifest = tmp_path / "n.mar"
    with zipfile.ZipFile(no_manifest, "w") as zf:
        zf.writestr("a.txt", b"1")
    bad = write_zip(tmp_path / "b.mar", {}, manifest(modelVersion="../x"))
    for archive in (garbage, no_manifest, bad, tmp_path / "missing.mar"):
        with pytest.raises(ArchiveError) as info:
            extract_archive(archive, tmp_path / "out")
        assert str(tmp_path) not in str(info.value)
        assert archive.name in str(info.value)
