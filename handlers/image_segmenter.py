"""The ``image_segmenter`` built-in handler, as TorchServe's: an image in, each pixel's most likely
class and its probability out.

Input per request: as ``image_classifier`` takes it, with the same transforms (shorter side to 256,
center crop 224, ImageNet normalization; model-config.yaml's ``image`` section changes them). The
model answers ``{"out": N x K x H x W}`` (torchvision's segmentation models) or that tensor itself.

Output per image: an H x W x 2 list, ``[class, probability]`` for each pixel (TorchServe answers
this instead of the K scores of every pixel, which would be tens of megabytes).
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import PredictionException
from .image_classifier import ImageClassifier


class ImageSegmenter(ImageClassifier):
    """Segmentation: the top class of every pixel (see the module docstring)."""

    def get_insights(self, tensor_data: Any, raw_data: Any, target: Any) -> list[Any]:
        """501: Integrated Gradients needs one score per class, which segmenters do not give
        (TorchServe's handler runs Captum anyway and fails)."""
        raise PredictionException("the image_segmenter handler does not support explanations", 501)

    def postprocess(self, data: Any) -> list[Any]:
        if isinstance(data, dict):
            data = data.get("out")
        if not isinstance(data, torch.Tensor) or data.dim() != 4:
            raise PredictionException(
                "the model's output is not an N x K x H x W tensor (or {'out': ...})"
            )
        probs = torch.softmax(data.float(), dim=1)
        top = torch.max(probs, dim=1)
        return torch.stack([top.indices.to(top.values.dtype), top.values], dim=3).tolist()
