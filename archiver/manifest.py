"""The archive manifest (``MAR-INF/MANIFEST.json``): TorchServe's schema plus a ``torchbay`` object.

Torch-free: the server imports this. TorchServe 0.12 manifests (no ``torchbay`` object) validate
too; unknown fields are kept so a manifest round-trips unchanged.

    {"createdOn": "%d/%m/%Y %H:%M:%S", "runtime": "python", "archiverVersion": "0.12.0",
     "model": {"modelName", "modelVersion", "serializedFile"?, "handler", "modelFile"?,
               "configFile"?, "requirementsFile"?, "extensions"?},
     "torchbay": {"format", "precision", "files": {relpath: sha256}, "parity", "example_input",
                  "input_shape", "input_dtype", "inputs"?, "outputs"?, "archiver_version"}?}
"""

from __future__ import annotations

import json
import re
import tarfile
import zipfile
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from torchbay.archiver.errors import UNREADABLE, CorruptArchiveError, ManifestError
from torchbay.archiver.signature import TensorSpec

MANIFEST_PATH = "MAR-INF/MANIFEST.json"
CREATED_ON_FORMAT = "%d/%m/%Y %H:%M:%S"
# torch-model-archiver's rule (model_packaging_utils.check_model_name_regex_or_exit), matched
# with fullmatch (``$`` would let a trailing newline through). Names and versions become folder
# names, so both are capped and can never hold "/" or be "..".
MODEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]*")
MAX_MODEL_NAME_LEN = 128
# TorchServe versions look like "1.0", "2", "1.0.0-rc1", "2.1+cu121".
MODEL_VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.+]*")
MAX_MODEL_VERSION_LEN = 64
# A handler's module part: a built-in name, a dotted module path or a file in the model folder.
_FUNCTION_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# model fields (and unknown ones with these suffixes) that name a file inside the archive
_PATH_FIELDS = ("serializedFile", "modelFile", "configFile", "requirementsFile", "extensions")
_PATH_SUFFIXES = ("File", "Files", "Path", "Paths")
# A manifest is a few KiB; refuse to read a huge one into memory.
MAX_MANIFEST_BYTES = 1 << 20
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

Format = Literal["torchscript", "exported", "eager", "aoti"]
Precision = Literal["fp32", "fp16", "bf16", "int8-dynamic"]


def is_valid_model_name(name: str) -> bool:
    """True when ``name`` passes torch-model-archiver's model-name rule."""
    return (
        isinstance(name, str)
        and len(name) <= MAX_MODEL_NAME_LEN
        and MODEL_NAME_RE.fullmatch(name) is not None
    )


def is_valid_model_version(version: str) -> bool:
    """True for a version that is safe as part of a folder name (``1.0``, ``2``, ``1.0.0-rc1``)."""
    return (
        isinstance(version, str)
        and len(version) <= MAX_MODEL_VERSION_LEN
        and MODEL_VERSION_RE.fullmatch(version) is not None
    )


# The fields that become folder names: (what, check, pattern, the rule in words).
_FOLDER_NAME_RULES = {
    "model_name": (
        "model name",
        is_valid_model_name,
        MODEL_NAME_RE,
        "letters, digits, '_', '-', '.'; not starting with a symbol; "
        f"at most {MAX_MODEL_NAME_LEN} characters",
    ),
    "model_version": (
        "model version",
        is_valid_model_version,
        MODEL_VERSION_RE,
        f"like 1.0, 2 or 1.0.0-rc1; at most {MAX_MODEL_VERSION_LEN} characters",
    ),
}


def check_folder_name(field: str, value: str) -> str:
    """``value`` when it is a valid ``model_name`` / ``model_version`` (each names a folder on the
    server), else ValueError saying the rule."""
    what, valid, pattern, rule = _FOLDER_NAME_RULES[field]
    if not valid(value):
        raise ValueError(f"{what} {value!r} must match {pattern.pattern} ({rule})")
    return value


def handler_spec_problem(spec: str) -> str | None:
    """Why a handler spec is unsafe, or None. Specs: a built-in name, a dotted module path,
    ``file.py``, ``file.py:fn`` or ``module:fn``; file paths must stay inside the model folder."""
    module, sep, function = spec.strip().partition(":")
    if not module:
        return "empty handler"
    if sep and not _FUNCTION_RE.fullmatch(function):
        return f"{function!r} is not a Python function name"
    return safe_relpath(module)


def safe_relpath(name: str) -> str | None:
    """Why ``name`` is not a safe relative POSIX path inside an archive, or None when it is."""
    if not name or "\x00" in name:
        return "empty name or NUL byte"
    if "\\" in name:
        return "backslash in path"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    if ".." in PurePosixPath(name).parts:
        return "'..' in path"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "control character in path"
    return None


def _path_values(value: Any) -> list[Any]:
    """The strings a path-like manifest field holds (a string, a list or a mapping of them)."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [v for item in value for v in _path_values(item)]
    if isinstance(value, dict):
        return [v for item in value.values() for v in _path_values(item)]
    return [value]


def check_model_paths(model: dict[str, Any]) -> None:
    """Raise ValueError naming the first ``model`` field that is not a safe relative path."""
    for key, value in model.items():
        if key not in _PATH_FIELDS and not key.endswith(_PATH_SUFFIXES):
            continue
        for item in _path_values(value):
            if not isinstance(item, str):
                raise ValueError(f"{key}: must be a file name, got {type(item).__name__}")
            if key == "extensions" and not item.strip():
                continue
            why = safe_relpath(item)
            if why:
                raise ValueError(f"{key} {item!r} must be a path inside the archive: {why}")


class Tolerance(BaseModel):
    """Parity limits: a packed model passes when it is within every limit that is set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_abs_error: float | None = None
    max_rel_error: float | None = None
    min_top1_agreement: float | None = None


class Parity(BaseModel):
    """What the parity check measured between the reference model and the packed one."""

    model_config = ConfigDict(frozen=True, extra="allow")

    max_abs_error: float
    max_rel_error: float
    top1_agreement: float | None = None
    tolerance: Tolerance
    passed: bool
    allowed_drift: bool = False


class TorchbayInfo(BaseModel):
    """torchbay's additions to the manifest."""

    model_config = ConfigDict(frozen=True, extra="allow")

    format: Format
    precision: Precision = "fp32"
    files: dict[str, str] = Field(default_factory=dict)
    parity: Parity | None = None
    example_input: str | None = None
    input_shape: list[int] | None = None
    input_dtype: str = "float32"
    # The tensor signature (archiver/signature.py), recorded from the example input and a trace.
    inputs: list[TensorSpec] | None = None
    outputs: list[TensorSpec] | None = None
    # TorchScript frozen by --optimize; the loader should run torch.jit.optimize_for_inference
    # (its MKLDNN-prepacked constants cannot be serialized, so that pass runs at load time).
    optimized: bool = False
    archiver_version: str = ""

    @field_validator("files")
    @classmethod
    def _check_files(cls, files: dict[str, str]) -> dict[str, str]:
        for name, digest in files.items():
            why = safe_relpath(name)
            if why:
                raise ValueError(f"files[{name!r}]: {why}")
            if not _SHA256_RE.match(digest):
                raise ValueError(f"files[{name!r}]: not a lowercase sha256 hex digest")
        return files


class ModelInfo(BaseModel):
    """The ``model`` object, with TorchServe's camelCase field names."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    model_name: str = Field(alias="modelName")
    # torch-model-archiver always writes it; very old archives may not (TorchServe uses "1.0").
    model_version: str = Field(default="1.0", alias="modelVersion")
    serialized_file: str | None = Field(default=None, alias="serializedFile")
    handler: str
    model_file: str | None = Field(default=None, alias="modelFile")
    config_file: str | None = Field(default=None, alias="configFile")
    requirements_file: str | None = Field(default=None, alias="requirementsFile")
    extensions: Any = None

    @field_validator("model_version", mode="before")
    @classmethod
    def _version_as_str(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value

    @field_validator("model_name", "model_version")
    @classmethod
    def _check_folder_name(cls, value: str, info: ValidationInfo) -> str:
        return check_folder_name(info.field_name or "", value)

    @field_validator("handler")
    @classmethod
    def _check_handler(cls, handler: str) -> str:
        why = handler_spec_problem(handler)
        if why:
            raise ValueError(
                f"handler {handler!r} must be a built-in, a module or a file "
                f"inside the archive: {why}"
            )
        return handler

    @model_validator(mode="before")
    @classmethod
    def _check_paths(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_model_paths(data)
        return data


PYTHON_RUNTIMES = ("python", "python2", "python3")


class Manifest(BaseModel):
    """MAR-INF/MANIFEST.json. ``torchbay`` is None for archives made by torch-model-archiver."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    created_on: str = Field(
        default_factory=lambda: datetime.now().strftime(CREATED_ON_FORMAT), alias="createdOn"
    )
    runtime: str = "python"
    archiver_version: str = Field(default="", alias="archiverVersion")
    model: ModelInfo
    torchbay: TorchbayInfo | None = None

    @field_validator("runtime")
    @classmethod
    def _python_runtime(cls, runtime: str) -> str:
        # torch-model-archiver's --runtime: python, python3, or LSP (TorchServe's C++ backend).
        if runtime.lower() not in PYTHON_RUNTIMES:
            raise ValueError(
                f"runtime {runtime[:64]!r} is not served: torchbay runs Python handlers "
                f"(runtime {', '.join(PYTHON_RUNTIMES)}; LSP is TorchServe's C++ backend)"
            )
        return runtime

    def to_json(self) -> str:
        """Serialize with TorchServe's field names, omitting unset optional fields."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(by_alias=True, exclude_none=True)
        # exclude_none would drop parity/example_input; keep the torchbay object complete.
        if self.torchbay is not None:
            data["torchbay"] = self.torchbay.model_dump(mode="json")
        return data


def json_object(raw: bytes | str, source: str) -> dict[str, Any]:
    """``raw`` as a JSON object; ManifestError naming ``source`` for anything else (text that is
    no JSON, nested past the parser's recursion limit, or not an object)."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{source}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ManifestError(f"{source}: not valid JSON (nested too deep)") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: must be a JSON object")
    return data


def parse_manifest(raw: bytes | str, *, source: str = MANIFEST_PATH) -> Manifest:
    """Validate manifest JSON text; raises ManifestError naming the first bad field."""
    data = json_object(raw, source)
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "(root)"
        raise ManifestError(
            f"{source}: {where}: {first.get('msg')} ({exc.error_count()} error(s))"
        ) from None


def _read_limited(stream: Any, source: str) -> bytes:
    raw = stream.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{source}: larger than {MAX_MANIFEST_BYTES} bytes")
    return raw


def tar_manifest_name(names: list[str]) -> str | None:
    """The manifest member of a TorchServe ``.tar.gz`` (``<model>/MAR-INF/MANIFEST.json``)."""
    for name in names:
        parts = PurePosixPath(name).parts
        if parts[-2:] == ("MAR-INF", "MANIFEST.json") and len(parts) <= 3:
            return name
    return None


def is_tar(path: Path) -> bool:
    """``path`` is a tar, or a compressed stream that holds one; a damaged compressed stream
    (a truncated .tar.gz: EOFError) counts, so that reading it says it is corrupt."""
    try:
        return tarfile.is_tarfile(path)
    except UNREADABLE:
        return True


def missing_manifest(label: str, names: list[str]) -> str:
    """Why a zip has no model manifest: a workflow archive (torch-workflow-archiver's ``.war``)
    says what it is and where it goes, anything else that the manifest is missing."""
    if "WAR-INF/MANIFEST.json" in names:
        return (
            f"{label}: a workflow archive (WAR-INF/MANIFEST.json), not a model archive: register"
            " it with POST /workflows?url=... (its models and handler are checked there)"
        )
    return f"{label}: no {MANIFEST_PATH} in the archive"


def read_manifest(path: str | Path) -> Manifest:
    """Read the manifest of a ``.mar``/zip, a TorchServe ``.tar.gz`` or an archive directory.

    Only the manifest is read; nothing is extracted. Raises ManifestError when it is missing or
    invalid, CorruptArchiveError when the archive cannot be opened.
    """
    path = Path(path)
    label = path.name  # never the absolute path: these messages reach API clients
    if path.is_dir():
        target = path / MANIFEST_PATH
        if not target.is_file():
            raise ManifestError(f"{label}: no {MANIFEST_PATH} (not an archive directory)")
        with target.open("rb") as fh:
            source = f"{label}/{MANIFEST_PATH}"
            return parse_manifest(_read_limited(fh, source), source=source)
    if not path.is_file():
        raise ManifestError(f"{label}: no such archive")
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as zf:
                try:
                    info = zf.getinfo(MANIFEST_PATH)
                except KeyError:
                    raise ManifestError(missing_manifest(label, zf.namelist())) from None
                with zf.open(info) as fh:
                    raw = _read_limited(fh, MANIFEST_PATH)
        except UNREADABLE as exc:
            raise CorruptArchiveError(f"{label}: corrupt zip archive ({exc})") from None
        return parse_manifest(raw, source=f"{label}:{MANIFEST_PATH}")
    if is_tar(path):
        try:
            with tarfile.open(path, "r:*") as tf:
                name = tar_manifest_name(tf.getnames())
                member = tf.getmember(name) if name else None
                if member is None or not member.isfile():
                    raise ManifestError(f"{label}: no {MANIFEST_PATH} in the archive")
                fh = tf.extractfile(member)
                assert fh is not None
                raw = _read_limited(fh, name or MANIFEST_PATH)
        except UNREADABLE as exc:
            raise CorruptArchiveError(f"{label}: corrupt tar archive ({exc})") from None
        return parse_manifest(raw, source=f"{label}:{name}")
    raise CorruptArchiveError(f"{label}: not a zip (.mar), a .tar.gz or an archive directory")
