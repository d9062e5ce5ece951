"""The model store's side of registration: which archives it holds, where a URL points in it,
what a version's config resolves to, and the checks on names that become folder names. Torch-free.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from torchbay.server.config.settings import ModelConfig, ServerConfig
from torchbay.server.config.sources import resolve_model_config
from torchbay.server.errors import BadRequest, ModelNotFound, NotFound
from torchbay.server.serving.archives import (
    MANIFEST_PATH,
    Manifest,
    ModelInfo,
    is_valid_model_name,
    is_valid_model_version,
    safe_relpath,
)

ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz", ".zip")


def archive_path(store: Path | None, url: str) -> Path:
    """A model-store archive named by ``url`` (a file name or path inside the store)."""
    if store is None:
        raise BadRequest("No model store is configured (--model-store)")
    if url.startswith("file://"):
        url = url[len("file://") :]
    if any(ord(c) < 0x20 for c in url):
        raise BadRequest(f"Model archive name {url!r} has a control character")
    if ".." in url.replace("\\", "/").split("/"):  # TorchServe's answer, even inside the store
        raise ModelNotFound(f"Relative path is not allowed in url: {url[:256]}")
    try:
        candidate = (store / url).resolve()
        root = store.resolve()
        if candidate != root and root not in candidate.parents:
            raise BadRequest(f"Model archive must be inside the model store: {url}")
        found = candidate.exists()
    except OSError:  # a name too long for the file system, ...
        found = False
    if not found:  # TorchServe's answer (404 ModelNotFoundException)
        raise ModelNotFound(f"Model not found at: {url[:256]}")
    return candidate


def startup_directory(url: str) -> Path | None:
    """A model directory named by an absolute path at start-up (``--models model=/opt/ml/model``,
    SageMaker's layout), wherever it is: the operator named it, so it is not held to the store.
    As TorchServe reads it, a folder holding only one folder (a tarball's root) means that one.
    None when ``url`` is not an absolute directory (the model store's rules apply)."""
    path = Path(url.removeprefix("file://"))
    if not path.is_absolute() or not path.is_dir():
        return None
    entries = list(path.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else path


def is_model_directory(path: Path) -> bool:
    """A directory without MAR-INF/MANIFEST.json: served in place (a link, never copied)."""
    return path.is_dir() and not (path / MANIFEST_PATH).is_file()


def directory_manifest(path: Path, name: str | None) -> Manifest:
    """The manifest TorchServe 0.12 makes up for a model directory (ModelManager): the name it
    was given, else the folder's; version 1.0; no handler (``default_service_handler`` then)."""
    model = ModelInfo.model_construct(model_name=name or path.name, model_version="1.0", handler="")
    return Manifest(model=model)


def identity(path: Path) -> tuple[int, int] | None:
    """An archive file's (size, modification time): another one means the file was replaced
    (a Triton repository load reloads the model then). None for a folder or a missing file."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_size, stat.st_mtime_ns) if path.is_file() else None


def store_archives(store: Path | None) -> list[Path]:
    """Every archive in the model store (``load_models=all``)."""
    if store is None or not store.is_dir():
        return []
    return [
        path
        for path in sorted(store.iterdir())
        if (path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES))
        or (path.is_dir() and (path / "MAR-INF" / "MANIFEST.json").is_file())
    ]


def model_config(
    server: ServerConfig,
    name: str,
    version: str,
    model_dir: Path,
    manifest: Manifest,
    overrides: Mapping[str, Any],
    default_workers: int | None,
    url: str | None = None,
) -> ModelConfig:
    """A version's resolved config: the server's defaults, the archive's YAML, the API's values
    (``url``: the archive as registered, see ``resolve_model_config``)."""
    api = dict(overrides)
    initial_workers = api.pop("initial_workers", None)
    if initial_workers is not None:
        api["min_worker"] = initial_workers
        api.setdefault("max_worker", max(initial_workers, 0))
    return resolve_model_config(
        server,
        name=name,
        version=version,
        archive_yaml=read_model_yaml(model_dir, manifest),
        api_overrides=api,
        default_workers=default_workers,
        url=url,
    )


def check_name_and_version(name: str, version: str) -> None:
    """Both become part of a folder name: refuse anything but a plain model name / version."""
    if not is_valid_model_name(name):
        raise BadRequest(
            f"Invalid model name {name!r}: letters, digits, '_', '-' and '.' only, "
            "starting with a letter or digit"
        )
    if not is_valid_model_version(version):
        raise BadRequest(
            f"Invalid model version {version!r}: must look like 1.0, 2 or 1.0.0-rc1 "
            "(letters, digits, '.', '-', '_', '+')"
        )


def remove(path: Path) -> None:
    """Remove a download or a version's folder; a model directory's link, never its files."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def read_model_yaml(model_dir: Path, manifest: Manifest) -> dict[str, Any] | None:
    config_file = manifest.model.config_file
    if not config_file:
        return None
    why = safe_relpath(config_file)
    if why:
        raise BadRequest(f"The archive's config file {config_file!r} is not inside it: {why}")
    path = model_dir / config_file
    if not path.is_file():
        raise NotFound(f"The archive's config file {config_file} is missing")
    # safe_load only: TorchServe's YAML parsing of archive configs was an RCE (CVE-2022-1471).
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        problem = "nested too deep" if isinstance(exc, RecursionError) else exc
        raise BadRequest(f"{config_file} is not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"{config_file} must be a YAML mapping")
    return data
