"""torchbay.handlers: what a handler author imports: BaseHandler, Context, the built-in handlers
(image_classifier, text_classifier, tensor), errors, metrics, utils, streaming and the test helper
(testing).

What only the worker uses (the Service, request decoding, the OIP codecs, model loading and the
device path) is the ``runtime`` sub-package; the worker and ``torchbay verify`` call
``runtime.service.load_service(model_dir, ...)`` and then ``Service.predict(requests)`` (also
importable from here, lazily). Names are imported lazily so ``import torchbay.handlers`` does not
import torch (only ``base_handler``, ``runtime.loading`` and the built-in handlers do).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_service": "runtime.service",
    "Service": "runtime.service",
    "Request": "runtime.service",
    "Response": "runtime.service",
    "BatchOutcome": "runtime.service",
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
