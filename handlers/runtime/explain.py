"""Explanations with Captum, as TorchServe's built-in handlers give them (an optional extra).

``/explanations/{m}``, KServe v1 ``:explain`` and a request with the ``explain: True`` header go
through the handler's ``explain_handle``; the image classifier answers Captum's Integrated
Gradients attributions of each image (TorchServe's ``VisionHandler.get_insights``: 15 steps, the
request's ``target`` class, 0 by default), one nested list per request, the input's shape; the
text classifier answers Captum's Layer Integrated Gradients over the model's embedding layer,
summarized as TorchServe's ``TextHandler`` does (``{"importances", "words"}`` per request). Captum
is an optional dependency (``pip install 'torchbay[explain]'``); without it the answer is a clear
501, and the server and every other request are unaffected.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import BadInput, PredictionException

N_STEPS = 15  # TorchServe's
CAPTUM_STEPS = 50  # LayerIntegratedGradients' default, which TorchServe's TextHandler keeps
STEP_TOKENS = 1 << 16  # tokens in one forward pass of a text explanation, at most


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


def target_of(row: Any) -> Any:
    """The ``target`` class of an explanation request: a form field, or in a JSON body."""
    if not isinstance(row, dict):
        return None
    body = row.get("data") or row.get("body")
    return row.get("target") or (body.get("target") if isinstance(body, dict) else None)


def _captum_attr() -> Any:
    """``captum.attr``; a 501 that says how to install it when Captum is missing."""
    try:
        import captum.attr
    except ImportError:
        raise PredictionException(
            "explanations need Captum, which is not installed: pip install 'torchbay[explain]'",
            501,
        ) from None
    return captum.attr


def integrated_gradients(model: Any, inputs: torch.Tensor, target: int) -> list[Any]:
    """Captum's Integrated Gradients of ``model`` at ``inputs`` for class ``target``."""
    attr = _captum_attr()
    with torch.enable_grad():
        attributions = attr.IntegratedGradients(model).attribute(
            inputs, target=target, n_steps=N_STEPS
        )
    return attributions.tolist()


def embedding_layer(model: Any) -> torch.nn.Module:
    """The layer text attributions are taken over: ``model.embedding`` (TorchServe's name), else
    the model's first ``Embedding`` or ``EmbeddingBag``; 501 when it has none, or when it is
    TorchScript (Captum attributes through forward hooks, which a ScriptModule does not run)."""
    if isinstance(model, torch.jit.ScriptModule):
        raise PredictionException(
            "text explanations need an eager model (model.py and a state dict), not TorchScript",
            501,
        )
    layer = getattr(model, "embedding", None)
    if isinstance(layer, torch.nn.Module):
        return layer
    for module in model.modules() if isinstance(model, torch.nn.Module) else ():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            return module
    raise PredictionException("text explanations need a model with an embedding layer", 501)


def layer_integrated_gradients(
    model: Any,
    inputs: torch.Tensor,
    baselines: torch.Tensor,
    extra: tuple[torch.Tensor, ...],
    target: int,
) -> torch.Tensor:
    """Captum's Layer Integrated Gradients of ``model`` over its embedding layer at ``inputs``
    (token ids; ``extra``: the model's other arguments) from ``baselines`` (padding ids), for
    class ``target``, with Captum's default steps (TorchServe's ``TextHandler`` sets none)."""
    attr = _captum_attr()
    lig = attr.LayerIntegratedGradients(model, embedding_layer(model))
    with torch.enable_grad():
        return lig.attribute(
            inputs,
            baselines,
            additional_forward_args=extra or None,
            target=target,
            internal_batch_size=steps_per_pass(inputs),
        )


def steps_per_pass(inputs: torch.Tensor) -> int | None:
    """Captum's ``internal_batch_size`` for one text's token ids: None (all the steps in one
    forward pass, as TorchServe) unless that pass would hold over ``STEP_TOKENS`` tokens; then
    as many steps as fit, so that a long text (no ``max_length``) costs passes, not 50 times
    its memory (200 000 tokens took 8 GB). Not for 1-D ids (an EmbeddingBag's ``offsets``
    input), whose first dimension Captum takes for examples; the bag holds no per-token
    activations to multiply."""
    if inputs.dim() < 2 or inputs.numel() * CAPTUM_STEPS <= STEP_TOKENS:
        return None
    return max(1, STEP_TOKENS // inputs.numel())


def summarize(attributions: torch.Tensor) -> list[Any]:
    """TorchServe's ``TextHandler.summarize_attributions``, kept as it computes it so answers
    compare: a softmax over the last (embedding) dimension, divided by the norm of the rows'
    sums. One row per embedding output: per token for ``Embedding``, one for ``EmbeddingBag``."""
    soft = torch.softmax(attributions.detach().float(), dim=-1)
    return (soft / torch.norm(soft.sum(dim=-1))).tolist()
