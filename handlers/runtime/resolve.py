"""Handler resolution as TorchServe's ts/model_loader.py does it, and the ``ts`` import alias.

Handler specs:
  * a built-in name: ``tensor`` (alias ``base``), ``image_classifier``, ``image_segmenter``,
    ``object_detector``, ``text_classifier``;
  * ``file.py`` or ``file``: a module in the model directory holding one handler class (a class
    with ``handle``; BaseHandler subclasses preferred, the most derived one wins) or a module-level
    ``handle(data, context)`` function;
  * ``file.py:function`` or ``module:function``: a function ``fn(data, context)``;
  * an importable module path (``ts.torch_handler.image_classifier``, ``torchbay.handlers.tensor``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import utils
from ..errors import HandlerError, HandlerLoadError

BUILTIN_HANDLERS: dict[str, str] = {
    "tensor": "torchbay.handlers.tensor",
    "base": "torchbay.handlers.tensor",
    # TorchServe's name for its BaseHandler (torch-model-archiver --handler base_handler)
    "base_handler": "torchbay.handlers.base_handler",
    "image_classifier": "torchbay.handlers.image_classifier",
    "image_segmenter": "torchbay.handlers.image_segmenter",
    "object_detector": "torchbay.handlers.object_detector",
    "text_classifier": "torchbay.handlers.text_classifier",
}


@dataclass
class ResolvedHandler:
    """``entry(data, context)`` serves a batch; ``instance`` is the handler object, if a class."""

    spec: str
    entry: Callable[[Any, Any], Any]
    instance: Any = None

    @property
    def is_function(self) -> bool:
        return self.instance is None


def resolve_handler(spec: str, model_dir: str | Path, outside_ok: bool = False) -> ResolvedHandler:
    """Import and instantiate the handler ``spec`` names; raises HandlerLoadError. With
    ``outside_ok``, an absolute file is imported from its folder (``_import_by_folder``)."""
    spec = (spec or "").strip()
    if not spec:
        raise HandlerLoadError("no handler given (manifest model.handler is empty)")
    module_part, _, function = spec.partition(":")
    if outside_ok and module_part.startswith("/"):
        module = _import_by_folder(module_part)
    else:
        module = _import_handler_module(module_part, Path(model_dir))
    # TorchServe (model_loader): the module's function (``handle`` unless named) is the entry
    # point, even beside a handler class (a module-level ``handle`` that wraps its class's);
    # a module without it is served by its handler class (SageMaker's default_service_handler
    # names handler_service.py:handle, a class's method).
    fn = getattr(module, function or "handle", None)
    if callable(fn) and not inspect.isclass(fn):
        return ResolvedHandler(spec, fn)
    cls = _handler_class(module, module_part)
    if cls is not None:
        instance = cls()
        return ResolvedHandler(spec, instance.handle, instance)
    if function:
        raise HandlerLoadError(f"handler {spec!r}: {module_part!r} has no function {function!r}")
    raise HandlerLoadError(
        f"handler {spec!r}: {module_part!r} defines no handler class and no handle() function"
    )


def start_handler(
    spec: str, model_dir: Path, context: Any, outside_ok: bool = False
) -> ResolvedHandler:
    """``resolve_handler``, then the handler's ``initialize(context)`` (a function handler:
    ``handle(None, context)``, TorchServe's convention); raises HandlerLoadError for either, naming
    the archive's requirements file when a module it imports is missing."""
    from .exits import exits_refused
    from .loading import missing_packages

    manifest = context.manifest
    try:
        with exits_refused():  # sys.exit() in initialize: a failure to load (exits.py)
            resolved = resolve_handler(spec, model_dir, outside_ok=outside_ok)
            if resolved.is_function:
                resolved.entry(None, context)
            else:
                resolved.instance.initialize(context)
    except HandlerLoadError as exc:
        raise missing_packages(exc, manifest, exc.__cause__) from exc.__cause__
    except HandlerError as exc:
        raise HandlerLoadError(f"handler {spec!r} failed to initialize: {exc}") from exc
    except Exception as exc:  # its traceback: the cause, in the worker's log of the failure
        failed = HandlerLoadError(f"handler {spec!r} failed to initialize: {exc!r}")
        raise missing_packages(failed, manifest, exc) from exc
    return resolved


def device_of(instance: Any, gpu_id: int | None) -> str:
    """The device a loaded handler runs on: its ``device``, else the worker's GPU, or the CPU
    when it has none or torch finds no CUDA here (as BaseHandler then falls back)."""
    device = getattr(instance, "device", None)
    if device is not None:
        return str(device)
    if gpu_id is None:
        return "cpu"
    import torch

    return f"cuda:{gpu_id}" if torch.cuda.is_available() else "cpu"


def _import_handler_module(name: str, model_dir: Path) -> types.ModuleType:
    if name in BUILTIN_HANDLERS:
        return importlib.import_module(BUILTIN_HANDLERS[name])
    from .loading import import_file, inside

    stem = name[:-3] if name.endswith(".py") else name
    # Only a path inside the model folder is ever imported as a file (no "/abs", no "..").
    path = inside(model_dir, f"{stem}.py", "handler")
    if path.is_file():
        return import_file(path, stem)
    if name.endswith(".py") or "/" in name:
        raise HandlerLoadError(f"handler file {name!r} not found in the archive")
    try:
        return importlib.import_module(stem)
    except ImportError as exc:
        raise HandlerLoadError(
            f"unknown handler {name!r}: not a built-in ({', '.join(sorted(BUILTIN_HANDLERS))}), "
            f"not a file in the model directory, not an importable module ({exc})"
        ) from exc
    except Exception as exc:
        raise HandlerLoadError(f"importing handler module {stem!r} failed: {exc!r}") from exc


def _import_by_folder(name: str) -> types.ModuleType:
    """An absolute handler file, as TorchServe loads ``default_service_handler``: its folder goes
    first on the path and the module is imported by its name (EnvironmentUtils, model_loader).
    Only the server's configuration names one (the registry refuses one from API clients, and
    a manifest's handler never gets here)."""
    folder, _, file_name = name.rpartition("/")
    stem = file_name[:-3] if file_name.endswith(".py") else file_name
    if folder not in sys.path:
        sys.path.insert(0, folder or "/")
    try:
        return importlib.import_module(stem)
    except ImportError as exc:
        raise HandlerLoadError(f"handler {name!r} cannot be imported: {exc}") from exc
    except Exception as exc:
        raise HandlerLoadError(f"importing handler module {stem!r} failed: {exc!r}") from exc


def _handler_class(module: types.ModuleType, name: str) -> type | None:
    from ..base_handler import BaseHandler

    classes = [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if c.__module__ == module.__name__ and callable(getattr(c, "handle", None))
    ]
    if len(classes) > 1:
        based = [c for c in classes if issubclass(c, BaseHandler)]
        # The most derived candidates: those no other candidate subclasses.
        leaves = [c for c in based if not any(o is not c and issubclass(o, c) for o in based)]
        if len(leaves) != 1:
            names = sorted(c.__name__ for c in classes)
            raise HandlerLoadError(f"handler module {name!r} has several handler classes {names}")
        classes = leaves
    return classes[0] if classes else None


# -- TorchServe compatibility alias -----------------------------------------------------------

_OTF = {  # TorchServe's streaming call, and the stop it raises here
    "send_intermediate_predict_response": "streaming.send_intermediate_predict_response",
    "StreamCancelled": "streaming.StreamCancelled",
}
# TorchServe's modules a handler imports -> {name: "torchbay.handlers module.attribute"}.
_ALIASES: dict[str, dict[str, str]] = {
    "ts.torch_handler.base_handler": {"BaseHandler": "base_handler.BaseHandler"},
    "ts.context": {"Context": "context.Context", "RequestProcessor": "context.RequestProcessor"},
    "ts.utils.util": {name: f"utils.{name}" for name in utils.__all__},
    "ts.metrics.dimension": {"Dimension": "metrics.Dimension"},
    "ts.metrics.metric_type_enum": {"MetricTypes": "metrics.MetricTypes"},
    "ts.metrics.metric_cache_errors": {
        name: f"metrics.{name}"
        for name in (
            "MetricsCacheKeyError",
            "MetricsCacheValueError",
            "MetricsCacheTypeError",
            "GeneralMetricsCacheError",
        )
    },
    "ts.torch_handler.vision_handler": {"VisionHandler": "image_classifier.ImageClassifier"},
    "ts.torch_handler.image_classifier": {"ImageClassifier": "image_classifier.ImageClassifier"},
    "ts.torch_handler.text_classifier": {"TextClassifier": "text_classifier.TextClassifier"},
    "ts.torch_handler.object_detector": {"ObjectDetector": "object_detector.ObjectDetector"},
    "ts.torch_handler.image_segmenter": {"ImageSegmenter": "image_segmenter.ImageSegmenter"},
    "ts.protocol.otf_message_handler": _OTF,
    "ts.handler_utils.utils": _OTF,  # TorchServe >= 0.9 exports it here too
    "ts.handler_utils.timer": {"timed": "timer.timed"},
    "ts.handler_utils.micro_batching": {"MicroBatching": "micro_batching.MicroBatching"},
}


def install_ts_alias() -> bool:
    """Make ``import ts.torch_handler.base_handler`` & co. resolve to torchbay's classes.

    Only installs when no real ``ts`` package is importable; returns whether it installed.
    Called by ``load_service`` (inside the process that loads handlers), never at import.
    """
    if "ts" in sys.modules:
        return getattr(sys.modules["ts"], "__torchbay_alias__", False)
    if importlib.util.find_spec("ts") is not None:
        return False
    for full, names in _ALIASES.items():
        # Lazy (PEP 562): the aliased class is imported when a handler first asks for it.
        _ensure_module(full).__getattr__ = _lazy(full, names)
    return True


def _lazy(full: str, names: dict[str, str]) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # inspect & co. probe dunders on every module
            raise AttributeError(name)
        if name not in names:
            raise AttributeError(f"module {full!r} has no attribute {name!r}")
        module, attr = names[name].rsplit(".", 1)
        return getattr(importlib.import_module(f"..{module}", __package__), attr)

    return __getattr__


def _ensure_module(full: str) -> types.ModuleType:
    parent = None
    parts = full.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        module = sys.modules.get(name)
        if module is None:
            module = types.ModuleType(name, "torchbay compatibility alias")
            module.__path__ = []  # a package, so submodule imports resolve via sys.modules
            module.__torchbay_alias__ = True
            sys.modules[name] = module
            if parent is not None:
                setattr(parent, parts[i], module)
        parent = module
    return parent
