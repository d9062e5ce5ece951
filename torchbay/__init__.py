"""torchbay: a pure-Python, TorchServe-compatible server for PyTorch models.

Public names are imported lazily so that ``import torchbay`` (and so the frontend, which imports
``torchbay.server``) never pulls in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["BaseHandler", "Context", "PredictionException", "__version__"]

_LAZY = {
    "BaseHandler": ("torchbay.handlers.base_handler", "BaseHandler"),
    "Context": ("torchbay.handlers.context", "Context"),
    "PredictionException": ("torchbay.handlers.errors", "PredictionException"),
}

if TYPE_CHECKING:  # pragma: no cover
    from torchbay.handlers.base_handler import BaseHandler
    from torchbay.handlers.context import Context
    from torchbay.handlers.errors import PredictionException


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'torchbay' has no attribute {name!r}") from None
    import importlib

    return getattr(importlib.import_module(module_name), attr)
