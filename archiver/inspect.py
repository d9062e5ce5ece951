"""``torchbay inspect ARCHIVE``: the manifest, every file with size and sha256, and the parity.

Torch-free. Reads only the archive's directory (zip central directory / tar headers) and the
manifest; nothing is extracted.
"""

from __future__ import annotations

import json
import tarfile
import zipfile
from pathlib import Path
from typing import Any

from torchbay.archiver.errors import UNREADABLE, ArchiveError, CorruptArchiveError
from torchbay.archiver.manifest import MANIFEST_PATH, Manifest, read_manifest, tar_manifest_name


def list_files(path: str | Path) -> dict[str, int]:
    """{member name: uncompressed size} of an archive (without extracting)."""
    path = Path(path)
    if path.is_dir():
        return {
            p.relative_to(path).as_posix(): p.stat().st_size
            for p in sorted(path.rglob("*"))
            if p.is_file() and not p.is_symlink()
        }
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                return {i.filename: i.file_size for i in zf.infolist() if not i.is_dir()}
        with tarfile.open(path, "r:*") as tf:
            members = tf.getmembers()
            top = tar_manifest_name([m.name for m in members]) or MANIFEST_PATH
            prefix = top[: -len(MANIFEST_PATH)]
            return {m.name[len(prefix) :]: m.size for m in members if m.isfile()}
    except UNREADABLE as exc:
        raise CorruptArchiveError(f"{path}: cannot list the archive ({exc})") from None


def describe(path: str | Path) -> dict[str, Any]:
    """The manifest plus ``files``: [{name, size, sha256 (from the manifest, or None)}]."""
    manifest = read_manifest(path)
    sizes = list_files(path)
    hashes = manifest.torchbay.files if manifest.torchbay else {}
    files = [
        {"name": name, "size": size, "sha256": hashes.get(name)}
        for name, size in sorted(sizes.items())
    ]
    return {"archive": str(path), "manifest": manifest.to_dict(), "files": files}


def render(info: dict[str, Any], manifest: Manifest) -> str:
    """Human-readable text of ``describe``'s result."""
    model = manifest.model
    lines = [
        f"archive:    {info['archive']}",
        f"model:      {model.model_name} version {model.model_version}",
        f"handler:    {model.handler}",
        f"serialized: {model.serialized_file or '-'}"
        + (f"  (model file {model.model_file})" if model.model_file else ""),
        f"created:    {manifest.created_on} by archiver {manifest.archiver_version or '?'} "
        f"(runtime {manifest.runtime})",
    ]
    for label, value in (("config", model.config_file), ("requirements", model.requirements_file)):
        if value:
            lines.append(f"{label + ':':<12}{value}")
    tb = manifest.torchbay
    if tb is None:
        lines.append("torchbay:   none (a TorchServe archive: no hashes, format inferred at load)")
    else:
        lines.append(
            f"format:     {tb.format}, precision {tb.precision}"
            + (", optimized (frozen TorchScript)" if tb.optimized else "")
        )
        if tb.example_input and tb.input_shape is not None:
            lines.append(
                f"example:    {tb.example_input} (per-sample shape {tb.input_shape}, "
                f"{tb.input_dtype})"
            )
        elif tb.example_input:
            lines.append(f"example:    {tb.example_input} (one array per input, by name)")
        for label, specs in (("inputs", tb.inputs), ("outputs", tb.outputs)):
            if specs:
                text = ", ".join(f"{s.name} {s.datatype} {s.shape}" for s in specs)
                lines.append(f"{label + ':':<12}{text}")
        if tb.parity is None:
            lines.append("parity:     not checked (no example input)")
        else:
            p = tb.parity
            top1 = "n/a" if p.top1_agreement is None else f"{p.top1_agreement:.3f}"
            verdict = "passed" if p.passed else "FAILED (packed with --allow-drift)"
            limits = p.tolerance.model_dump().items()
            tol = ", ".join(f"{k}={v}" for k, v in limits if v is not None)
            lines.append(
                f"parity:     {verdict}: max_abs_error={p.max_abs_error:.3g} "
                f"max_rel_error={p.max_rel_error:.3g} top1_agreement={top1} (tolerance {tol})"
            )
    lines.append("files:")
    for f in info["files"]:
        digest = f["sha256"] or ("-" if f["name"] == MANIFEST_PATH else "(not hashed)")
        lines.append(f"  {f['size']:>12,}  {digest}  {f['name']}")
    return "\n".join(lines)


def inspect_archive(path: str | Path, *, as_json: bool = False) -> str:
    """The text ``torchbay inspect`` prints."""
    if not Path(path).exists():
        raise ArchiveError(f"{path}: no such archive")
    info = describe(path)
    if as_json:
        return json.dumps(info, indent=2)
    return render(info, read_manifest(path))
