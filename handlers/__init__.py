"""torchbay.handlers: BaseHandler, Context, the built-in handlers, model loading and the Service.

The worker and ``torchbay verify`` call ``load_service(model_dir, ...)`` and then
``Service.predict(requests)``. Names are imported lazily so ``import torchbay.handlers`` does
not import torch (only ``base_handler``, ``loading`` and the built-in handlers do).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_service": "service",
    "Service": "service",
    "Request": "service",
    "Response": "service",
    "BatchOutcome": "service",
    "Context": "context",
    "MetricsCache": "metrics",
    "HandlerError": "errors",
    "HandlerLoadError": "errors",
    "PredictionException": "errors",
    "BadInput": "errors",
    "BaseHandler": "base_handler",
    "TensorHandler": "tensor",
    "ImageClassifier": "image_classifier",
    "TextClassifier": "text_classifier",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
