"""Where a model's tensor signature can come from, answered without pydantic.

``archiver.signature.model_signature`` parses a signature (pydantic); the worker asks
:func:`describes_tensors` first, so a model with none (every TorchServe ``.mar``) never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def describes_tensors(info: Mapping[str, Any], yaml_config: Mapping[str, Any]) -> bool:
    """Whether the manifest's ``torchbay`` section (``inputs``/``outputs``, or the legacy
    ``input_shape``) or model-config.yaml (``inputs``/``outputs``) describes the tensors."""
    return (
        info.get("inputs") is not None
        or info.get("outputs") is not None
        or bool(info.get("input_shape"))
        or "inputs" in yaml_config
        or "outputs" in yaml_config
    )
