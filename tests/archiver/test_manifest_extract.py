"""Manifest parsing and safe extraction (torch-free)."""

from __future__ import annotations

import hashlib
import io
import json
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.tarballs import write_tar_with_link
from torchbay.archiver.errors import (
    CorruptArchiveError,
    HashMismatchError,
    ManifestError,
    UnsafeMemberError,
)
from torchbay.archiver.extract import extract_archive, verify_directory
from torchbay.archiver.limits import Budget
from torchbay.archiver.manifest import (
    Manifest,
    ModelInfo,
    TorchbayInfo,
    parse_manifest,
    read_manifest,
)

TS_MANIFEST = {
    "createdOn": "17/03/2025 11:20:57",
    "runtime": "python",
    "model": {
        "modelName": "densenet161",
        "serializedFile": "model.pt",
        "handler": "image_classifier",
        "modelFile": "model.py",
        "modelVersion": "1.0",
        "requirementsFile": "requirements.txt",
        "configFile": "model-config.yaml",
    },
    "archiverVersion": "0.12.0",
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest(files: dict[str, bytes]) -> str:
    return Manifest(
        model=ModelInfo(model_name="m", handler="tensor"),
        torchbay=TorchbayInfo(format="eager", files={n: _sha(d) for n, d in files.items()}),
    ).to_json()


def _zip(path: Path, members: dict[str, bytes], manifest: str | None, *, stored: bool = False):
    mode = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", mode) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        if manifest is not None:
            zf.writestr("MAR-INF/MANIFEST.json", manifest)
    return path


def test_torchserve_manifest_reads_without_torchbay_object() -> None:
    m = parse_manifest(json.dumps(TS_MANIFEST))
    assert m.torchbay is None
    assert m.model.model_name == "densenet161"
    assert m.model.config_file == "model-config.yaml"
    assert m.created_on == "17/03/2025 11:20:57"
    assert json.loads(m.to_json()) == TS_MANIFEST  # round-trips unchanged


def test_manifest_rejects_bad_model_name_and_bad_hash() -> None:
    bad = {**TS_MANIFEST, "model": {**TS_MANIFEST["model"], "modelName": "-bad name"}}
    with pytest.raises(ManifestError, match=r"modelName"):
        parse_manifest(json.dumps(bad))
    with pytest.raises(ManifestError, match=r"sha256"):
        parse_manifest(
            json.dumps({**TS_MANIFEST, "torchbay": {"format": "eager", "files": {"a": "x"}}})
        )
    with pytest.raises(ManifestError, match=r"not valid JSON"):
        parse_manifest(b"{nope")


def test_read_manifest_from_zip_tar_and_dir(tmp_path: Path) -> None:
    data = {"a.txt": b"hello"}
    mar = _zip(tmp_path / "m.mar", data, _manifest(data))
    assert read_manifest(mar).model.model_name == "m"
    out = tmp_path / "dir"
    extract_archive(mar, out)
    assert read_manifest(out).torchbay.files["a.txt"] == _sha(b"hello")
    tgz = tmp_path / "m.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(out / "a.txt", arcname="m/a.txt")
        tf.add(out / "MAR-INF" / "MANIFEST.json", arcname="m/MAR-INF/MANIFEST.json")
    assert read_manifest(tgz).model.handler == "tensor"
    dest = tmp_path / "from-tgz"
    extract_archive(tgz, dest)
    assert (dest / "a.txt").read_bytes() == b"hello"


@pytest.mark.parametrize("stored", [False, True])
def test_extract_checks_hashes_and_writes_files(tmp_path: Path, stored: bool) -> None:
    data = {"a.txt": b"hello", "sub/b.bin": b"\x00" * 100}
    mar = _zip(tmp_path / "m.mar", data, _manifest(data), stored=stored)
    manifest = extract_archive(mar, tmp_path / "out")
    assert (tmp_path / "out" / "sub" / "b.bin").read_bytes() == b"\x00" * 100
    assert set(manifest.torchbay.files) == set(data)


def test_tampered_member_is_refused_and_destination_cleaned(tmp_path: Path) -> None:
    manifest = _manifest({"a.txt": b"hello"})
    mar = _zip(tmp_path / "m.mar", {"a.txt": b"HELLO"}, manifest)
    with pytest.raises(HashMismatchError, match=r"a.txt") as info:
        extract_archive(mar, tmp_path / "out")
    assert info.value.member == "a.txt"
    assert not (tmp_path / "out").exists()


def test_unlisted_and_missing_members_are_refused(tmp_path: Path) -> None:
    manifest = _manifest({"a.txt": b"hello"})
    extra = _zip(tmp_path / "x.mar", {"a.txt": b"hello", "evil.py": b"x"}, manifest)
    with pytest.raises(HashMismatchError, match=r"evil.py.*not listed"):
        extract_archive(extra, tmp_path / "o1")
    missing = _zip(tmp_path / "y.mar", {}, manifest)
    with pytest.raises(HashMismatchError, match=r"a.txt.*missing"):
        extract_archive(missing, tmp_path / "o2")


@pytest.mark.parametrize(
    ("name", "reason"),
    [("../evil.py", r"'\.\.'"), ("/etc/evil", "absolute"), ("a/../../evil", r"'\.\.'")],
)
def test_path_traversal_members_are_refused(tmp_path: Path, name: str, reason: str) -> None:
    mar = _zip(tmp_path / "m.mar", {name: b"x"}, _manifest({}))
    with pytest.raises(UnsafeMemberError, match=reason) as info:
        extract_archive(mar, tmp_path / "out")
    assert info.value.member == name
    assert not (tmp_path / "evil.py").exists()


def test_symlink_member_is_refused(tmp_path: Path) -> None:
    mar = tmp_path / "m.mar"
    with zipfile.ZipFile(mar, "w") as zf:
        link = zipfile.ZipInfo("link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
        zf.writestr("MAR-INF/MANIFEST.json", _manifest({}))
    with pytest.raises(UnsafeMemberError, match=r"'link'.*symlink"):
        extract_archive(mar, tmp_path / "out")


def test_tar_link_member_is_refused(tmp_path: Path) -> None:
    tgz = write_tar_with_link(tmp_path / "m.tar.gz", "m", _manifest({}), tarfile.SYMTYPE)
    with pytest.raises(UnsafeMemberError, match=r"model.pt.*link"):
        extract_archive(tgz, tmp_path / "out")


def test_size_limits_total_and_ratio(tmp_path: Path) -> None:
    data = {"big.bin": b"x" * 1000, "b.bin": b"y" * 600}
    mar = _zip(tmp_path / "m.mar", data, _manifest(data))
    with pytest.raises(UnsafeMemberError, match=r"over the limit of 1200 bytes"):
        extract_archive(mar, tmp_path / "o2", max_total_bytes=1200)
    assert not (tmp_path / "o2").exists()
    # No per-member cap: one member far past any "member limit" loads within the total.
    extract_archive(mar, tmp_path / "o3", max_total_bytes=1 << 20)
    # Declared sizes can lie (zip bombs); the bytes actually written are counted too.
    with pytest.raises(UnsafeMemberError, match=r"bomb.*expands past"):
        Budget(500).copy("bomb", io.BytesIO(b"z" * 1000), io.BytesIO())
    with pytest.raises(UnsafeMemberError, match=r"bomb.*compression ratio"):
        Budget(1 << 30, 100).copy("bomb", io.BytesIO(bytes(3 << 20)), io.BytesIO(), 1000)


def test_duplicate_member_is_refused(tmp_path: Path) -> None:
    mar = tmp_path / "m.mar"
    with pytest.warns(UserWarning, match=r"Duplicate name"), zipfile.ZipFile(mar, "w") as zf:
        zf.writestr("a.txt", b"1")
        zf.writestr("a.txt", b"2")
        zf.writestr("MAR-INF/MANIFEST.json", json.dumps(TS_MANIFEST))
    with pytest.raises(UnsafeMemberError, match=r"duplicate"):
        extract_archive(mar, tmp_path / "out")


def test_corrupt_zip_and_missing_manifest(tmp_path: Path) -> None:
    data = {"a.txt": b"hello" * 100}
    good = _zip(tmp_path / "m.mar", data, _manifest(data)).read_bytes()
    truncated = tmp_path / "t.mar"
    truncated.write_bytes(good[: len(good) // 2])
    with pytest.raises(CorruptArchiveError):
        extract_archive(truncated, tmp_path / "o1")
    garbage = tmp_path / "g.mar"
    garbage.write_bytes(b"not an archive at all")
    with pytest.raises(CorruptArchiveError):
        extract_archive(garbage, tmp_path / "o2")
    no_manifest = _zip(tmp_path / "n.mar", data, None)
    with pytest.raises(ManifestError, match=r"MANIFEST"):
        extract_archive(no_manifest, tmp_path / "o3")


def test_directory_verified_in_place_and_copied(tmp_path: Path) -> None:
    data = {"a.txt": b"hello"}
    mar = _zip(tmp_path / "m.mar", data, _manifest(data))
    folder = tmp_path / "folder"
    extract_archive(mar, folder)
    assert extract_archive(folder, folder).model.model_name == "m"
    extract_archive(folder, tmp_path / "copy")
    assert (tmp_path / "copy" / "a.txt").read_bytes() == b"hello"
    (folder / "a.txt").write_bytes(b"tampered")
    with pytest.raises(HashMismatchError, match=r"a.txt"):
        verify_directory(folder)
    (folder / "a.txt").unlink()
    (folder / "a.txt").symlink_to("/etc/passwd")
    with pytest.raises(UnsafeMemberError, match=r"link"):
        verify_directory(folder)
