"""Explanations with Captum, as TorchServe's built-in handlers give them (an optional extra).

``/explanations/{m}``, KServe v1 ``:explain`` and a request with the ``explain: True`` header go
through the handler's ``explain_handle``; the image classifier answers Captum's Integrated
Gradients attributions of each image (TorchServe's ``VisionHandler.get_insights``: 15 steps, the
request's ``target`` class, 0 by default), one nested list per request, the input's shape. Captum
is an optional dependency (``pip install 'torchbay[explain]'``); without it the answer is a clear
501, and the server and every other request are unaffected.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import BadInput, PredictionException

N_STEPS = 15  # TorchServe's


def target_class(value: Any) -> int:
    """The request's ``target`` (TorchServe's explain field): a class index; 0 when absent."""
    if value in (None, "", 0):
        return 0
    try:
        target = int(value)
    except (TypeError, ValueError):
        raise BadInput(f"target must be a class index, got {str(value)[:40]!r}") from None
    if target < 0:
        raise BadInput(f"target must be a class index, got {target}")
    return target


def integrated_gradients(model: Any, inputs: torch.Tensor, target: int) -> list[Any]:
    """Captum's Integrated Gradients of ``model`` at ``inputs`` for class ``target``."""
    try:
        from captum.attr import IntegratedGradients
    except ImportError:
        raise PredictionException(
            "explanations need Captum, which is not installed: pip install 'torchbay[explain]'",
            501,
        ) from None
    with torch.enable_grad():
        attributions = IntegratedGradients(model).attribute(inputs, target=target, n_steps=N_STEPS)
    return attributions.tolist()
