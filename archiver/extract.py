"""Safe unpacking of model archives. Torch-free: the server imports this.

``extract_archive`` accepts a ``.mar`` (zip, deflated or stored), a TorchServe ``.tar.gz`` (all
members under ``<model-name>/``) or an archive directory (``no-archive``), and refuses, naming the
member: absolute paths, ``..``, symlinks / hardlinks / device or FIFO members, duplicate names,
encrypted members, a total or compression ratio over the limits (checked on the declared sizes
first, then by counting the bytes actually written, because a zip bomb's headers lie), and, when
the manifest has a ``torchbay.files`` table, any file whose sha256 differs, any file not listed and
any listed file that is missing.

Limits (``ServerConfig.max_archive_expanded_size`` / ``max_archive_compression_ratio``): the
expanded total (64 GiB by default) and the free disk space of the destination, and the
expanded/compressed ratio (100 by default) of every member and of the whole archive once it
expands past 1 MiB. Weights barely compress, so a multi-GB checkpoint loads (there is no
per-member cap), while a zip bomb is refused from its declared sizes before anything is written,
and again while writing, by counting the bytes actually written (headers lie).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO

from torchbay.archiver.errors import (
    UNREADABLE,
    ArchiveError,
    CorruptArchiveError,
    HashMismatchError,
    ManifestError,
    UnsafeMemberError,
)
from torchbay.archiver.limits import (
    CHUNK,
    DEFAULT_MAX_RATIO,
    DEFAULT_MAX_TOTAL_BYTES,
    Budget,
    free_bytes,
)
from torchbay.archiver.manifest import (
    MANIFEST_PATH,
    MAX_MANIFEST_BYTES,
    Manifest,
    is_tar,
    missing_manifest,
    parse_manifest,
    read_manifest,
    safe_relpath,
    tar_manifest_name,
)


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _normalize(name: str) -> str:
    """Check a member name and return its canonical relative form (no ``./``, no trailing /)."""
    why = safe_relpath(name)
    if why:
        raise UnsafeMemberError(name, why)
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if not parts:
        raise UnsafeMemberError(name, "empty path")
    return "/".join(parts)


class _Writer:
    """Writes checked members under ``dest`` and checks hashes against the manifest."""

    def __init__(self, dest: Path, manifest: Manifest | None, budget: Budget) -> None:
        self.dest = dest
        self.root = dest.resolve()
        self.budget = budget
        # No manifest (a workflow archive, archiver/war.py) or no torchbay table: no hash checks.
        has_table = manifest is not None and manifest.torchbay is not None
        self.expected = dict(manifest.torchbay.files) if has_table else None  # type: ignore[union-attr]
        self.seen: set[str] = set()

    def target(self, name: str) -> Path:
        if name in self.seen:
            raise UnsafeMemberError(name, "duplicate member name")
        self.seen.add(name)
        target = (self.dest / name).resolve()
        # Belt and braces: a name that passed the checks still must land inside dest.
        if self.root not in target.parents:
            raise UnsafeMemberError(name, "resolves outside the destination")
        return target

    def check_listed(self, names: list[str]) -> None:
        """Before writing anything: every file listed, every listed file present."""
        if self.expected is None:
            return
        present = {n for n in names if n != MANIFEST_PATH}
        for name in sorted(present - self.expected.keys()):
            raise HashMismatchError(name, "not listed in the manifest's torchbay.files")
        for name in sorted(self.expected.keys() - present):
            raise HashMismatchError(name, "listed in the manifest but missing from the archive")

    def write(self, name: str, src: IO[bytes], compressed: int | None = None) -> None:
        target = self.target(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as dst:
            digest = self.budget.copy(name, src, dst, compressed)
        os.chmod(target, 0o644)  # never carry modes (setuid, exec) over from the archive
        if self.expected is not None and name != MANIFEST_PATH:
            want = self.expected[name]
            if digest != want:
                raise HashMismatchError(
                    name, f"sha256 mismatch (manifest {want[:12]}..., content {digest[:12]}...)"
                )


def _zip_kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    fmt = stat.S_IFMT(mode)
    if info.is_dir() or fmt == stat.S_IFDIR:
        return "dir"
    if fmt in (0, stat.S_IFREG):
        return "file"
    if fmt == stat.S_IFLNK:
        return "symlink"
    return "special file"


def checked_zip_members(zf: zipfile.ZipFile, budget: Budget) -> list[tuple[str, zipfile.ZipInfo]]:
    """Every file member of ``zf`` with its normalized name, checked from the zip's directory
    (kind, encryption, declared sizes against ``budget``) before anything is written."""
    files: list[tuple[str, zipfile.ZipInfo]] = []
    declared_total = 0
    for info in zf.infolist():
        name = _normalize(info.filename)
        kind = _zip_kind(info)
        if kind == "dir":
            continue
        if kind != "file":
            raise UnsafeMemberError(info.filename, f"{kind} members are not allowed")
        if info.flag_bits & 0x1:
            raise UnsafeMemberError(info.filename, "encrypted members are not supported")
        declared_total += info.file_size
        budget.declare(name, info.file_size, declared_total, info.compress_size)
        files.append((name, info))
    return files


def open_zip(path: Path) -> zipfile.ZipFile:
    """``path`` opened as a zip (.mar or .war); a file that is not one is a CorruptArchiveError."""
    try:
        return zipfile.ZipFile(path)
    except UNREADABLE as exc:
        raise CorruptArchiveError(f"{path.name}: corrupt zip archive ({exc})") from None


def write_zip_members(
    zf: zipfile.ZipFile, files: list[tuple[str, zipfile.ZipInfo]], writer: _Writer, source: str
) -> None:
    """Write the checked ``files`` of ``zf`` through ``writer`` (which counts them against its
    budget); a member that does not read back whole is a CorruptArchiveError naming it."""
    for name, info in files:
        try:
            with zf.open(info) as src:
                writer.write(name, src, info.compress_size)
        except (*UNREADABLE, ValueError) as exc:  # BadZipFile: a CRC error
            raise CorruptArchiveError(f"{source}: member {name!r} is corrupt ({exc})") from None


def _extract_zip(path: Path, dest: Path, budget: Budget) -> Manifest:
    with open_zip(path) as zf:
        files = checked_zip_members(zf, budget)
        manifest = _zip_manifest(path, zf, files)
        writer = _Writer(dest, manifest, budget)
        writer.check_listed([n for n, _ in files])
        write_zip_members(zf, files, writer, path.name)
    return manifest


def _zip_manifest(
    path: Path, zf: zipfile.ZipFile, files: list[tuple[str, zipfile.ZipInfo]]
) -> Manifest:
    for name, info in files:
        if name == MANIFEST_PATH:
            if info.file_size > MAX_MANIFEST_BYTES:
                raise ManifestError(f"{path.name}: {MANIFEST_PATH} is too large")
            try:
                with zf.open(info) as fh:
                    raw = fh.read(MAX_MANIFEST_BYTES + 1)
            except UNREADABLE as exc:
                raise CorruptArchiveError(
                    f"{path.name}: member {name!r} is corrupt ({exc})"
                ) from None
            return parse_manifest(raw, source=f"{path.name}:{MANIFEST_PATH}")
    raise ManifestError(missing_manifest(path.name, [name for name, _ in files]))


def _tar_members(path: Path, tf: tarfile.TarFile, budget: Budget) -> list[tarfile.TarInfo]:
    """Read the headers one by one, checking kinds and the running declared size as they come,
    so a tar bomb is refused at its first oversized header rather than after inflating it all."""
    members: list[tarfile.TarInfo] = []
    declared_total = 0
    try:
        for member in tf:
            _normalize(member.name)
            if member.isdir():
                continue
            if member.issym() or member.islnk():
                raise UnsafeMemberError(member.name, "link members are not allowed")
            if not member.isfile():
                raise UnsafeMemberError(member.name, "special file members are not allowed")
            declared_total += member.size
            budget.declare(member.name, member.size, declared_total)
            members.append(member)
    except UNREADABLE as exc:
        raise CorruptArchiveError(f"{path.name}: corrupt tar archive ({exc})") from None
    return members


def _extract_tar(path: Path, dest: Path, budget: Budget) -> Manifest:
    try:
        tf = tarfile.open(path, "r:*")  # noqa: SIM115 (closed by the with below)
    except UNREADABLE as exc:
        raise CorruptArchiveError(f"{path.name}: corrupt tar archive ({exc})") from None
    with tf:
        members = _tar_members(path, tf, budget)
        manifest_name = tar_manifest_name([m.name for m in members])
        if manifest_name is None:
            raise ManifestError(f"{path.name}: no {MANIFEST_PATH} in the archive")
        # TorchServe's tgz puts everything under "<model-name>/"; strip that prefix.
        prefix = manifest_name[: -len(MANIFEST_PATH)]
        files: list[tuple[str, tarfile.TarInfo]] = []
        for member in members:
            name = _normalize(member.name)
            if prefix and not (name + "/").startswith(prefix):
                raise UnsafeMemberError(member.name, f"outside the archive's top folder {prefix!r}")
            files.append((name[len(prefix) :], member))
        try:
            fh = tf.extractfile(manifest_name)
            assert fh is not None
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
        except UNREADABLE as exc:
            raise CorruptArchiveError(f"{path.name}: corrupt tar archive ({exc})") from None
        manifest = parse_manifest(raw, source=f"{path.name}:{manifest_name}")
        writer = _Writer(dest, manifest, budget)
        writer.check_listed([n for n, _ in files])
        for name, member in files:
            try:
                src = tf.extractfile(member)
                assert src is not None
                writer.write(name, src)
            except UNREADABLE as exc:
                raise CorruptArchiveError(
                    f"{path.name}: member {name!r} is corrupt ({exc})"
                ) from None
    return manifest


def verify_directory(
    path: str | Path, *, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
) -> Manifest:
    """Check an archive directory in place (no copy): links, sizes and sha256 as for a zip."""
    root = Path(path)
    manifest = read_manifest(root)
    budget = Budget(max_total_bytes)
    names: list[str] = []
    declared_total = 0
    for name, full in _walk(root):
        size = full.stat().st_size
        declared_total += size
        budget.declare(name, size, declared_total)
        names.append(name)
    expected = dict(manifest.torchbay.files) if manifest.torchbay else None
    if expected is not None:
        _Writer(root, manifest, budget).check_listed(names)
        for name in names:
            if name != MANIFEST_PATH and sha256_file(root / name) != expected[name]:
                raise HashMismatchError(name, "sha256 differs from the manifest")
    return manifest


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """Every regular file under ``root`` as (relative POSIX name, path); refuses links/specials."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for entry in dirnames + filenames:
            full = Path(dirpath) / entry
            rel = full.relative_to(root).as_posix()
            mode = full.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise UnsafeMemberError(rel, "links are not allowed")
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise UnsafeMemberError(rel, "special files are not allowed")
            yield rel, full


@contextmanager
def _cleanup_on_error(dest: Path) -> Iterator[None]:
    created = not dest.exists()
    if not created and any(dest.iterdir()):
        raise ArchiveError(f"destination folder {dest.name!r} is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        if created:
            shutil.rmtree(dest, ignore_errors=True)
        else:
            for child in dest.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        raise


def extract_archive(
    path: str | Path,
    dest_dir: str | Path,
    *,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_ratio: float = DEFAULT_MAX_RATIO,
) -> Manifest:
    """Unpack ``path`` into ``dest_dir`` (created; must be empty) and return its manifest.

    ``path`` is a ``.mar``/zip, a ``.tar.gz`` or an archive directory. A directory equal to
    ``dest_dir`` is verified in place; another directory is verified and copied. The expanded
    total may not pass ``max_total_bytes`` nor the destination's free disk space, and no member
    past 1 MiB (nor the archive as a whole) may expand more than ``max_ratio`` times. On any
    failure the destination is left empty and an ArchiveError subclass names the offending member.
    """
    src = Path(path)
    dest = Path(dest_dir)
    if src.is_dir():
        if dest.exists() and dest.resolve() == src.resolve():
            return verify_directory(src, max_total_bytes=max_total_bytes)
        free = free_bytes(dest)
        with _cleanup_on_error(dest):
            manifest = verify_directory(src, max_total_bytes=min(max_total_bytes, free))
            writer = _Writer(dest, manifest, Budget(max_total_bytes, max_ratio, free=free))
            for name, full in _walk(src):
                with open(full, "rb") as fh:
                    writer.write(name, fh)
        return manifest
    if not src.is_file():
        raise ArchiveError(f"{src.name}: no such archive")
    budget = Budget(
        max_total_bytes, max_ratio, archive_bytes=src.stat().st_size, free=free_bytes(dest)
    )
    with _cleanup_on_error(dest):
        if zipfile.is_zipfile(src):
            return _extract_zip(src, dest, budget)
        if is_tar(src):
            return _extract_tar(src, dest, budget)
        raise CorruptArchiveError(
            f"{src.name}: not a zip (.mar), a .tar.gz or an archive directory"
        )
