"""Handler resolution as TorchServe's ts/model_loader.py does it, and the ``ts`` import alias.

Handler specs:
  * a built-in name: ``tensor`` (alias ``base``), ``image_classifier``, ``text_classifier``;
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

from ..errors import HandlerLoadError

BUILTIN_HANDLERS: dict[str, str] = {
    "tensor": "torchbay.handlers.tensor",
    "base": "torchbay.handlers.tensor",
    "image_classifier": "torchbay.handlers.image_classifier",
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


def resolve_handler(spec: str, model_dir: str | Path) -> ResolvedHandler:
    """Import and instantiate the handler ``spec`` names; raises HandlerLoadError."""
    spec = (spec or "").strip()
    if not spec:
        raise HandlerLoadError("no handler given (manifest model.handler is empty)")
    module_part, _, function = spec.partition(":")
    module = _import_handler_module(module_part, Path(model_dir))
    if function:
        fn = getattr(module, function, None)
        if not callable(fn):
            raise HandlerLoadError(
                f"handler {spec!r}: {module_part!r} has no function {function!r}"
            )
        return ResolvedHandler(spec, fn)
    cls = _handler_class(module, module_part)
    if cls is not None:
        instance = cls()
        return ResolvedHandler(spec, instance.handle, instance)
    fn = getattr(module, "handle", None)
    if callable(fn):
        return ResolvedHandler(spec, fn)
    raise HandlerLoadError(
        f"handler {spec!r}: {module_part!r} defines no handler class and no handle() function"
    )


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

_ALIASES: dict[str, Callable[[], dict[str, Any]]] = {}


def _alias(name: str) -> Callable[[Callable[[], dict[str, Any]]], Callable[[], dict[str, Any]]]:
    def register(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        _ALIASES[name] = fn
        return fn

    return register


@_alias("ts.torch_handler.base_handler")
def _base_handler() -> dict[str, Any]:
    from .. import base_handler

    return {"BaseHandler": base_handler.BaseHandler}


@_alias("ts.context")
def _context() -> dict[str, Any]:
    from .. import context

    return {"Context": context.Context, "RequestProcessor": context.RequestProcessor}


@_alias("ts.utils.util")
def _util() -> dict[str, Any]:
    from .. import utils

    return {name: getattr(utils, name) for name in utils.__all__}


@_alias("ts.metrics.dimension")
def _dimension() -> dict[str, Any]:
    from ..metrics import Dimension

    return {"Dimension": Dimension}


@_alias("ts.metrics.metric_type_enum")
def _metric_type() -> dict[str, Any]:
    from ..metrics import MetricTypes

    return {"MetricTypes": MetricTypes}


@_alias("ts.torch_handler.vision_handler")
def _vision() -> dict[str, Any]:
    from ..image_classifier import ImageClassifier

    return {"VisionHandler": ImageClassifier}


@_alias("ts.torch_handler.image_classifier")
def _image() -> dict[str, Any]:
    from ..image_classifier import ImageClassifier

    return {"ImageClassifier": ImageClassifier}


@_alias("ts.torch_handler.text_classifier")
def _text() -> dict[str, Any]:
    from ..text_classifier import TextClassifier

    return {"TextClassifier": TextClassifier}


@_alias("ts.protocol.otf_message_handler")
@_alias("ts.handler_utils.utils")  # TorchServe >= 0.9 exports it here too
def _otf() -> dict[str, Any]:
    from .. import streaming

    return {
        "send_intermediate_predict_response": streaming.send_intermediate_predict_response,
        "StreamCancelled": streaming.StreamCancelled,
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
    for full, contents in _ALIASES.items():
        # Lazy (PEP 562): the aliased class is imported when a handler first asks for it.
        _ensure_module(full).__getattr__ = _lazy(full, contents)
    return True


def _lazy(full: str, contents: Callable[[], dict[str, Any]]) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # inspect & co. probe dunders on every module
            raise AttributeError(name)
        values = contents()
        if name not in values:
            raise AttributeError(f"module {full!r} has no attribute {name!r}")
        return values[name]

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
