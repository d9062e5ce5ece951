"""TorchServe's ``ts.utils.util`` helpers that handlers import (torch-free)."""

from __future__ import annotations

import enum
import importlib.util
import inspect
import itertools
import json
import logging
import os
import re
import sys
from types import ModuleType
from typing import Any

from .errors import PredictionException

__all__ = [
    "CLEANUP_REGEX",
    "PT2Backend",
    "PredictionException",
    "check_valid_pt2_backend",
    "get_yaml_config",
    "list_classes_from_module",
    "load_label_mapping",
    "map_class_to_label",
]

logger = logging.getLogger(__name__)

# TorchServe's: HTML tags and entities, which its text handlers strip from inputs.
CLEANUP_REGEX = re.compile("<.*?>|&([a-z0-9]+|#[0-9]{1,6}|#x[0-9a-f]{1,6});")


class PT2Backend(str, enum.Enum):
    """The torch.compile backends TorchServe's ``check_valid_pt2_backend`` accepts."""

    EAGER = "eager"
    AOT_EAGER = "aot_eager"
    INDUCTOR = "inductor"
    NVFUSER = "nvfuser"
    AOT_NVFUSER = "aot_nvfuser"
    AOT_CUDAGRAPHS = "aot_cudagraphs"
    OFI = "ofi"
    FX2TRT = "fx2trt"
    ONNXRT = "onnxrt"
    IPEX = "ipex"
    TORCHXLA_TRACE_ONCE = "torchxla_trace_once"
    OPENVINO = "openvino"
    TENSORRT = "tensorrt"
    HPU_BACKEND = "hpu_backend"


def check_valid_pt2_backend(backend: str) -> bool:
    """Whether ``backend`` is one of :class:`PT2Backend` (TorchServe's, with its warning)."""
    if backend in {member.value for member in PT2Backend}:
        return True
    logger.warning("%s is not a supported backend", backend)
    return False


def list_classes_from_module(module: ModuleType, parent_class: type | None = None) -> list[type]:
    """Classes defined in ``module`` itself (not imported), optionally subclasses of a parent."""
    classes = [
        c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__
    ]
    if parent_class is not None:
        return [c for c in classes if issubclass(c, parent_class)]
    return classes


def load_label_mapping(mapping_file_path: str | os.PathLike) -> dict[str, str] | None:
    """Load ``{class index: label}`` JSON (index_to_name.json); None when the file is missing.

    Values may be a label or a list whose last element is the label (ImageNet's
    ``["n01440764", "tench"]``); ``{"object_type_names": [...]}`` is accepted too.
    """
    if not os.path.isfile(mapping_file_path):
        logger.info("%s is missing; outputs will use class indices", mapping_file_path)
        return None
    with open(mapping_file_path, encoding="utf-8") as f:
        mapping = json.load(f)
    if not isinstance(mapping, dict):
        raise ValueError('index->name JSON mapping should be in "class": "label" format.')
    if isinstance(mapping.get("object_type_names"), list):
        return {str(k): v for k, v in enumerate(mapping["object_type_names"])}
    out: dict[str, str] = {}
    for key, value in mapping.items():
        label = value[-1] if isinstance(value, list) and value else value
        if not isinstance(label, str):
            raise ValueError("labels in index->name mapping must be either str or List[str]")
        out[str(key)] = label
    return out


def map_class_to_label(
    probs: list[list[float]], mapping: dict[str, str] | None = None, lbl_classes: Any = None
) -> list[dict[str, float]]:
    """``[{label: prob}]`` per row, for parallel lists of class ids and probabilities."""
    if not isinstance(probs, list):
        raise TypeError("Convert classes to list before doing mapping")
    if mapping is not None and not isinstance(mapping, dict):
        raise TypeError("Mapping must be a dict")
    if lbl_classes is None:
        lbl_classes = itertools.repeat(range(len(probs[0])), len(probs))
    return [
        {
            (mapping.get(str(c), str(c)) if mapping else str(c)): p
            for c, p in zip(*row, strict=False)
        }
        for row in zip(lbl_classes, probs, strict=False)
    ]


def get_yaml_config(yaml_file_path: str | os.PathLike) -> dict[str, Any]:
    import yaml

    with open(yaml_file_path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def exec_file(path: Any, name: str) -> ModuleType:
    """Execute the Python file ``path`` as module ``name``, registered in ``sys.modules`` (and
    removed again when it raises). ImportError when it cannot be loaded as a module at all."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {os.path.basename(str(path))!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def torchbay_info(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``torchbay`` object, or ``{}`` for a TorchServe archive."""
    info = manifest.get("torchbay")
    return info if isinstance(info, dict) else {}
