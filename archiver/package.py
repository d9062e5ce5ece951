"""``torchbay archive``: torch-model-archiver's flags and layout, plus conversion and parity.

``package(options)`` stages every file in a temporary folder (basenames at the root, as
torch-model-archiver does), converts the model when asked, runs the parity check on the packed
model loaded exactly as a worker loads it, hashes every file into the manifest and writes the
archive (``<name>.mar`` deflated or stored, ``<name>.tar.gz``, or a ``<name>/`` folder) atomically
(``write.py``).
This module imports torch only inside ``package`` and only when a model must be loaded.
"""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from torchbay import __version__
from torchbay.archiver.errors import ArchiveArgumentError
from torchbay.archiver.extract import sha256_file
from torchbay.archiver.manifest import Format, Manifest, ModelInfo, Parity, TorchbayInfo

# ArchiveOptions is defined beside Stage (options.py, which build.py imports too); callers take it
# from here, with ``package``.
from torchbay.archiver.options import ArchiveOptions, Stage
from torchbay.archiver.write import write_archive

BUILTIN_HANDLERS = (
    "tensor",
    "base",
    "base_handler",
    "image_classifier",
    "image_segmenter",
    "object_detector",
    "text_classifier",
)
# Handlers given as an importable module path are not copied in (resolved by the worker).
_MODULE_HANDLER_PREFIXES = ("torchbay.handlers.", "ts.torch_handler.")
EXAMPLE_NAME = "example_input.npy"
_SKIP_DIRS = {"__pycache__", "__MACOSX"}


def output_path(options: ArchiveOptions) -> Path:
    """Where the archive goes: ``<export>/<name>.mar``, ``.tar.gz`` or ``<name>/``."""
    suffix = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}
    return Path(options.export_path) / f"{options.model_name}{suffix[options.archive_format]}"


def _require_file(path: Path | None, flag: str) -> Path | None:
    if path is not None and not Path(path).is_file():
        raise ArchiveArgumentError(f"{flag} {str(path)!r} does not exist or is not a file")
    return Path(path) if path is not None else None


def _require_yaml_mapping(path: Path | None, flag: str) -> None:
    """``path`` is the YAML mapping the server reads it as (model-config.yaml's keys; empty is
    none): anything else would pack and then fail only when the model loads."""
    if path is None:
        return
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        problem = " ".join(str(exc).split())[:200] or "nested too deep"
        raise ArchiveArgumentError(f"{flag} {str(path)!r} is not valid YAML: {problem}") from None
    if data is not None and not isinstance(data, dict):
        raise ArchiveArgumentError(f"{flag} {str(path)!r} must be a YAML mapping of settings")


def resolve_handler(handler: str) -> tuple[str, Path | None]:
    """(manifest handler value, file to copy in). A file is stored by basename, like TorchServe."""
    if handler in BUILTIN_HANDLERS or handler.startswith(_MODULE_HANDLER_PREFIXES):
        return handler, None
    file_part, sep, function = handler.partition(":")
    path = Path(file_part)
    if path.suffix != ".py":
        path = path.with_name(path.name + ".py")  # torch-model-archiver appends .py
    if not path.is_file():
        raise ArchiveArgumentError(
            f"unknown handler {handler!r}: not a built-in ({', '.join(BUILTIN_HANDLERS)}) "
            f"and no file {str(path)!r}"
        )
    return path.name + (sep + function if function else ""), path


def _make_export_dir(export_dir: Path) -> None:
    """--export-path, made when missing (torch-model-archiver wants it to exist)."""
    if export_dir.exists() and not export_dir.is_dir():
        raise ArchiveArgumentError(f"--export-path {str(export_dir)!r} is not a directory")
    try:
        export_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArchiveArgumentError(
            f"--export-path {str(export_dir)!r} cannot be made: {exc.strerror or exc}"
        ) from None


def _add_extra(stage: Stage, spec: str) -> None:
    """torch-model-archiver's --extra-files: files by basename, directories' contents at root."""
    wildcard = any(ch in spec for ch in "*?[")
    matches = sorted(glob.glob(spec)) if wildcard else [spec]
    if not wildcard and not Path(spec).exists():
        raise ArchiveArgumentError(f"--extra-files {spec!r} does not exist")
    if wildcard and not matches:
        raise ArchiveArgumentError(f"--extra-files pattern {spec!r} matched nothing")
    for match in matches:
        path = Path(match)
        if path.is_file():
            stage.add(path.name, path)
        elif path.is_dir():
            _add_folder(stage, path)
        else:
            raise ArchiveArgumentError(f"--extra-files {match!r} is not a file or directory")


def _add_folder(stage: Stage, folder: Path) -> None:
    """A folder's files at the archive's root, subfolders kept (no hidden or cache folders). A
    link is refused: os.walk would list a linked folder but never enter it, leaving it out."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and d[0] != ".")
        for name in [*dirnames, *sorted(filenames)]:
            full = Path(dirpath) / name
            if full.is_symlink():
                raise ArchiveArgumentError(f"--extra-files: {full} is a link")
            if name in filenames:
                stage.add(full.relative_to(folder).as_posix(), full)


def _source_format(options: ArchiveOptions) -> Format:
    """The format of the given serialized file, inferred as TorchServe's BaseHandler does."""
    serialized = options.serialized_file
    if serialized is not None and serialized.suffix == ".pt2":
        return "exported"
    if options.model_file is not None or serialized is None:
        return "eager"
    return "torchscript"


def _target_format(options: ArchiveOptions, source: Format) -> Format:
    return {
        "none": source,
        "torchscript-trace": "torchscript",
        "torchscript-script": "torchscript",
        "export": "exported",
        "aoti": "aoti",
    }[options.convert]


def _check_options(options: ArchiveOptions, source: Format, target: Format) -> None:
    transforms = options.convert != "none" or options.precision != "fp32" or options.optimize
    if options.convert != "none" and source == "exported":
        raise ArchiveArgumentError("an exported .pt2 program cannot be converted again")
    if options.convert in ("export", "aoti") and source != "eager":
        raise ArchiveArgumentError(
            f"--convert {options.convert} needs an eager model (--model-file)"
        )
    if options.device != "cpu" and options.convert != "aoti":
        raise ArchiveArgumentError("--device applies to --convert aoti only")
    if transforms and options.serialized_file is None:
        raise ArchiveArgumentError(
            "--convert/--precision/--optimize need --serialized-file (a state dict with "
            "--model-file, or a TorchScript file)"
        )
    if transforms and source == "exported":
        raise ArchiveArgumentError(
            "an exported .pt2 cannot be re-cast; export again from the eager model"
        )
    if transforms and options.example_input is None:
        raise ArchiveArgumentError(
            "--convert/--precision/--optimize need --example-input FILE (a tensor saved with "
            "torch.save, or .npy, batch dimension first) for tracing and the parity check"
        )
    if options.optimize and target != "torchscript":
        raise ArchiveArgumentError(
            "--optimize applies to TorchScript only: add --convert torchscript-trace or "
            "torchscript-script"
        )


def package(options: ArchiveOptions) -> Path:
    """Build the archive described by ``options`` and return its path.

    Raises ArchiveArgumentError (bad options, missing files, unknown handler, existing output
    without ``force``), ConversionError (a format/precision cannot take the model) and ParityError
    (the packed model drifts past the tolerance without ``allow_drift``).
    """
    serialized = _require_file(options.serialized_file, "--serialized-file")
    model_file = _require_file(options.model_file, "--model-file")
    _require_file(options.requirements_file, "--requirements-file")
    _require_file(options.config_file, "--config-file")
    _require_yaml_mapping(options.config_file, "--config-file")
    _require_file(options.example_input, "--example-input")
    handler_value, handler_file = resolve_handler(options.handler)
    if model_file is not None and serialized is None:
        raise ArchiveArgumentError("--model-file needs --serialized-file (the state dict)")
    source = _source_format(options)
    target = _target_format(options, source)
    _check_options(options, source, target)
    out = output_path(options)
    _make_export_dir(Path(options.export_path))
    if out.exists() and not options.force:
        raise ArchiveArgumentError(f"{out} already exists; use -f/--force to overwrite")

    with tempfile.TemporaryDirectory(prefix="torchbay-archive-") as tmp:
        stage = Stage(Path(tmp))
        if handler_file is not None:
            stage.add(handler_file.name, handler_file)
        for spec in options.extra_files:
            _add_extra(stage, spec)
        for path in (options.requirements_file, options.config_file):
            if path is not None:
                stage.add(Path(path).name, Path(path))
        # staged first: the model file imports its sibling modules from them, as in a worker
        serialized_name, packed_model_file, parity, recorded = _model_files(
            options, stage, source, target, serialized, model_file
        )
        files = {name: sha256_file(src) for name, src in sorted(stage.files.items())}
        manifest = _manifest(
            options,
            handler_value,
            serialized_name,
            packed_model_file,
            target,
            files,
            parity,
            recorded,
        )
        write_archive(options.archive_format, out, stage.files, manifest, options.model_name)
    return out


def _model_files(
    options: ArchiveOptions,
    stage: Stage,
    source: Format,
    target: Format,
    serialized: Path | None,
    model_file: Path | None,
) -> tuple[str | None, str | None, Parity | None, dict[str, Any] | None]:
    """Stage the serialized model (converted if asked) and the model file; run the parity check.

    Returns (serializedFile, modelFile, parity, the manifest fields recorded from the example:
    example file, signature, legacy input_shape/input_dtype; or None).
    """
    transforms = options.convert != "none" or options.precision != "fp32" or options.optimize
    if serialized is None:
        return None, None, None, None
    if not transforms and options.example_input is None:
        stage.add(serialized.name, serialized)
        if model_file is not None:
            stage.add(model_file.name, model_file)
        return serialized.name, model_file.name if model_file else None, None, None
    from torchbay.archiver import build  # torch lives behind this import

    assert options.example_input is not None
    with build.model_dir_on_path(stage):
        return build.build_model(options, stage, source, target, serialized, model_file)


def _manifest(
    options: ArchiveOptions,
    handler: str,
    serialized_name: str | None,
    model_file_name: str | None,
    target: Format,
    files: dict[str, str],
    parity: Parity | None,
    recorded: dict[str, Any] | None,
) -> Manifest:
    model = ModelInfo(
        model_name=options.model_name,
        model_version=options.version,
        serialized_file=serialized_name,
        handler=handler,
        model_file=model_file_name,
        config_file=Path(options.config_file).name if options.config_file else None,
        requirements_file=(
            Path(options.requirements_file).name if options.requirements_file else None
        ),
    )
    info = TorchbayInfo(
        format=target,
        precision=options.precision,
        files=files,
        parity=parity,
        optimized=options.optimize,
        archiver_version=__version__,
        **(recorded or {}),  # the example file, the signature and the legacy input fields
    )
    return Manifest(
        runtime=options.runtime,
        archiver_version=__version__,
        model=model,
        torchbay=info,
    )
