"""Shared top-k classification postprocess for the built-in classifiers."""

from __future__ import annotations

from typing import Any

import torch

from .utils import map_class_to_label


def handler_config(context: Any, section: str) -> dict[str, Any]:
    """``model_yaml_config[section]`` (or ``model_yaml_config["handler"][section]``), or {}."""
    config = getattr(context, "model_yaml_config", None) or {}
    value = config.get(section)
    if value is None and isinstance(config.get("handler"), dict):
        value = config["handler"].get(section)
    return dict(value) if isinstance(value, dict) else {}


def topk_labels(
    logits: torch.Tensor, k: int, mapping: dict[str, str] | None
) -> list[dict[str, float]]:
    """Softmax over classes, then ``{label: prob}`` for the k most likely (most likely first)."""
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    probs = torch.softmax(logits.float(), dim=1)
    k = max(1, min(int(k), probs.shape[1]))
    values, classes = torch.topk(probs, k, dim=1)
    return map_class_to_label(values.tolist(), mapping, classes.tolist())
