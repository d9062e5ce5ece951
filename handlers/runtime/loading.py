"""Load a model by serialized format onto a device with the precision the manifest records.

The manifest is ``MAR-INF/MANIFEST.json`` in the model directory. Archives made by torchbay
carry a ``torchbay`` object (``format``, ``precision``, ``files``, ``input_shape``...);
TorchServe archives do not, and their format is inferred as TorchServe's BaseHandler does: a
``.pt2`` serialized file is a ``torch.export`` program, a serialized file with a ``modelFile``
is an eager state dict, anything else is TorchScript.

fp16/bf16 models are stored already cast by the archiver; ``model_input_dtype`` tells handlers the
dtype to cast floating inputs to. int8-dynamic models are TorchScript (loaded as is) or eager (the
model's Linear layers are quantized by handlers.int8 before its int8 state dict is loaded).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..errors import HandlerLoadError
from ..utils import exec_file, torchbay_info
from .exits import exits_refused

logger = logging.getLogger(__name__)

MANIFEST_PATH = "MAR-INF/MANIFEST.json"
FORMATS = ("torchscript", "exported", "eager", "aoti")
_PRECISION_DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "int8-dynamic": torch.float32,
}


def read_manifest(model_dir: str | Path) -> dict[str, Any]:
    """The parsed manifest, or a minimal one when the directory has none (loose model dir)."""
    path = Path(model_dir) / MANIFEST_PATH
    if not path.is_file():
        return {"model": {}}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HandlerLoadError(f"cannot read manifest {path}: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("model", {}), dict):
        raise HandlerLoadError(f"manifest {path} is not a JSON object with a 'model' object")
    manifest.setdefault("model", {})
    return manifest


def inside(model_dir: str | Path, relpath: str, field: str) -> Path:
    """``model_dir / relpath``, refused unless it is a relative path that stays inside the model
    folder (the manifest is checked at registration; this guards the worker all the same)."""
    rel = str(relpath)
    root = Path(model_dir).resolve()
    if (
        not rel
        or "\\" in rel
        or "\x00" in rel
        or Path(rel).is_absolute()
        or ".." in Path(rel).parts
    ):
        raise HandlerLoadError(f"{field} {rel!r} must be a relative path inside the archive")
    path = (root / rel).resolve()
    if root not in path.parents:
        raise HandlerLoadError(f"{field} {rel!r} resolves outside the archive")
    return path


def model_yaml_config(model_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The archive's model-config.yaml (``configFile``, inside the model folder) as a dict."""
    config_file = manifest.get("model", {}).get("configFile")
    if not config_file:
        return {}
    path = inside(model_dir, str(config_file), "configFile")
    if not path.is_file():
        raise HandlerLoadError(f"config file {config_file!r} not found in the archive")
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise HandlerLoadError(f"cannot read config file {config_file!r}: {exc}") from exc
    if not isinstance(config, dict):
        raise HandlerLoadError(f"config file {config_file!r} is not a mapping")
    return config


def missing_packages(
    error: HandlerLoadError, manifest: dict[str, Any], cause: BaseException | None
) -> HandlerLoadError:
    """``error``, naming the archive's requirements file when ``cause`` is a module the handler
    imports that is not installed: torchbay never installs that file (TorchServe does with
    ``install_py_dep_per_model=true``), so its packages must be installed where the server runs."""
    requirements = manifest.get("model", {}).get("requirementsFile")
    if not requirements or not isinstance(cause, ModuleNotFoundError):
        return error
    return HandlerLoadError(
        f"{error} (the archive's requirements file {str(requirements)!r} is not installed by "
        "torchbay: install its packages where the server runs)"
    )


def model_format(manifest: dict[str, Any]) -> str | None:
    """``torchscript`` | ``exported`` | ``eager`` | ``aoti``, or None without a serialized file."""
    info = torchbay_info(manifest)
    fmt = info.get("format")
    if fmt is not None:
        if fmt not in FORMATS:
            raise HandlerLoadError(f"unknown model format {fmt!r} in manifest (want {FORMATS})")
        return str(fmt)
    model = manifest.get("model", {})
    serialized = model.get("serializedFile")
    if not serialized:
        return None
    if str(serialized).endswith(".pt2"):
        return "exported"
    return "eager" if model.get("modelFile") else "torchscript"


def model_precision(manifest: dict[str, Any]) -> str:
    precision = str(torchbay_info(manifest).get("precision") or "fp32")
    if precision not in _PRECISION_DTYPES:
        raise HandlerLoadError(f"unknown precision {precision!r} in manifest")
    return precision


def hide_environment(pattern: str) -> None:
    """TorchServe's ``blacklist_env_vars``: each variable whose whole name matches ``pattern``
    leaves this process's environment (``os.environ`` unsets it for C code too), before the
    handler is imported."""
    if pattern:
        hidden = re.compile(pattern)
        for name in [n for n in os.environ if hidden.fullmatch(n)]:
            del os.environ[name]


def load_model(model_dir: str | Path, manifest: dict[str, Any], device: str | torch.device) -> Any:
    """Load the manifest's serialized model onto ``device``, in eval mode where applicable.

    Returns None when the manifest names no serialized file (a handler that loads its own model).
    Raises HandlerLoadError naming the file on any failure.
    """
    fmt = model_format(manifest)
    serialized = manifest.get("model", {}).get("serializedFile")
    # The archiver records a format ("eager") for a handler-only archive too: no file, no model.
    if fmt is None or not serialized:
        return None
    model_dir = Path(model_dir)
    serialized = str(serialized)
    path = inside(model_dir, serialized, "serializedFile")
    if not path.is_file():
        raise HandlerLoadError(f"model file {serialized!r} not found in the archive")
    device = torch.device(device)
    precision = model_precision(manifest)
    try:
        if fmt == "torchscript":
            model = torch.jit.load(str(path), map_location=device)
            model.eval()
            if (manifest.get("torchbay") or {}).get("optimized"):
                model = _optimize(model, serialized)
        elif fmt == "exported":
            model = _load_exported(path, device)
        elif fmt == "aoti":
            from .aoti_loader import load_aoti

            model = load_aoti(path, device)
        else:
            model = _load_eager(model_dir, manifest, path, device, precision)
    except HandlerLoadError:
        raise
    except Exception as exc:  # torch raises many unrelated types for a bad file
        raise HandlerLoadError(f"cannot load {fmt} model {serialized!r}: {exc}") from exc
    logger.info("loaded %s model %s (%s) on %s", fmt, serialized, precision, device)
    return model


def _optimize(model: Any, serialized: str) -> Any:
    """Apply ``torch.jit.optimize_for_inference`` to a frozen archive (``--optimize``).

    It cannot be saved (it embeds MKLDNN tensors), so the archiver stores the frozen module and
    every loader (workers, verify, the archiver's parity check) runs this same step.
    """
    try:
        return torch.jit.optimize_for_inference(model)
    except Exception as exc:  # keep serving the frozen module rather than fail the load
        logger.warning(
            "optimize_for_inference failed for %s; serving it frozen: %s", serialized, exc
        )
        return model


class _NoRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


def _load_exported(path: Path, device: torch.device) -> Any:
    # torch.export.load logs the whole traceback of a file it cannot read (a warning of its own
    # logger) before it raises; the error raised says it in one line (the caller's)
    silent, export_log = _NoRecords(), logging.getLogger("torch.export")
    export_log.addFilter(silent)
    try:
        program = torch.export.load(str(path))
    finally:
        export_log.removeFilter(silent)
    if device.type != "cpu":
        # Constants baked into the graph stay on the export device unless the program is moved.
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    # Exported modules refuse .eval()/.train(): they are already traced in the mode exported.
    return program.module()


def _load_eager(
    model_dir: Path, manifest: dict[str, Any], path: Path, device: torch.device, precision: str
) -> torch.nn.Module:
    model_file = manifest["model"].get("modelFile")
    if not model_file:
        raise HandlerLoadError("eager model needs 'modelFile' in the manifest")
    module = import_file(inside(model_dir, str(model_file), "modelFile"))
    cls = single_module_class(module, model_file)
    try:
        model = cls()
    except TypeError as exc:
        raise HandlerLoadError(
            f"model class {cls.__name__} in {model_file!r} must be constructible with no "
            f"arguments: {exc}"
        ) from exc
    state = torch.load(str(path), map_location=device, weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if precision == "int8-dynamic":
        model = quantize_dynamic(model, state)
    # assign=True keeps the stored dtype (fp16/bf16 weights stay half) and device.
    model.load_state_dict(state, assign=precision != "int8-dynamic")
    model.to(device)
    model.eval()
    return model


def quantize_dynamic(model: torch.nn.Module, state: Any = None) -> torch.nn.Module:
    """Dynamic int8 quantization of Linear layers (the archiver's int8-dynamic recipe), or the
    torch.ao recipe of archives made before it when ``state`` holds its packed weights."""
    from .int8 import quantize_for_state

    return quantize_for_state(model, state)


def import_file(path: Path, name: str | None = None) -> ModuleType:
    """Import a Python file by path as module ``name`` (default: its stem)."""
    if not path.is_file():
        raise HandlerLoadError(f"model/handler file {path.name!r} not found in the archive")
    try:
        with exits_refused():  # sys.exit() at import: a failure to load (exits.py)
            return exec_file(path, name or path.stem)
    except Exception as exc:
        raise HandlerLoadError(f"importing {path.name!r} failed: {exc!r}") from exc


def single_module_class(module: ModuleType, filename: str) -> type[torch.nn.Module]:
    """The one ``nn.Module`` subclass defined in ``module`` (as TorchServe requires)."""
    classes = [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if c.__module__ == module.__name__ and issubclass(c, torch.nn.Module)
    ]
    if len(classes) != 1:
        names = [c.__name__ for c in classes]
        raise HandlerLoadError(
            f"{filename!r} must define exactly one nn.Module class, found {len(classes)} {names}"
        )
    return classes[0]


def model_input_dtype(model: Any, manifest: dict[str, Any] | None = None) -> torch.dtype:
    """The floating dtype a handler should cast inputs to (float32 unless stored half)."""
    if manifest is not None and torchbay_info(manifest).get("precision"):
        return _PRECISION_DTYPES[model_precision(manifest)]
    if isinstance(model, torch.nn.Module):
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
    return torch.float32
