"""The ``object_detector`` built-in handler, as TorchServe's: an image in, the objects found out.

Input per request: as ``image_classifier`` takes it (bytes, base64, JSON ``{"data": ...}``). The
image is only made a float tensor in [0, 1] (TorchServe's ``ToTensor``: no resize, crop or
normalization, unless model-config.yaml's ``image`` section asks for them), and the model
(torchvision's detection models, or any with their output) answers one
``{"boxes", "labels", "scores"}`` dict per image.

Output per image: a list of ``{label: [x1, y1, x2, y2], "score": s}``, one per object scoring at
least ``threshold`` (0.5, as TorchServe's; model-config.yaml ``image: {threshold: ...}`` changes
it), labels from ``index_to_name.json`` (class index strings otherwise).

The batch goes to the model as TorchServe sends it, one stacked tensor, when its images have one
size and the model takes a tensor; as a list of images (torchvision's documented input) when the
model is a TorchScript module whose ``forward`` takes a list (a scripted torchvision detector, which
TorchServe cannot serve) or when the sizes differ (a batch TorchServe fails).
"""

from __future__ import annotations

from typing import Any

import torch

from .classify import handler_config
from .errors import PredictionException
from .image_classifier import ImageClassifier
from .utils import map_class_to_label


class ObjectDetector(ImageClassifier):
    """Detection: boxes, labels and scores above a threshold (see the module docstring)."""

    threshold = 0.5

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        config = handler_config(context, "image")
        # TorchServe's transform is ToTensor alone: the classifier's defaults do not apply.
        self.resize = config.get("resize")
        self.crop = config.get("crop")
        self.mean = torch.tensor(config.get("mean", [0.0] * self.channels)).reshape(-1, 1, 1)
        self.std = torch.tensor(config.get("std", [1.0] * self.channels)).reshape(-1, 1, 1)
        self.threshold = float(config.get("threshold", self.threshold))

    def preprocess(self, data: list[Any]) -> Any:
        images = self.map_items(data, self.load_item)
        images = [image.to(self.device, self.model_input_dtype) for image in images]
        if _takes_list(self.model) or len({tuple(i.shape) for i in images}) > 1:
            return images
        return torch.stack(images)

    def get_insights(self, tensor_data: Any, raw_data: Any, target: Any) -> list[Any]:
        """501: Integrated Gradients needs one score per class, which detectors do not give
        (TorchServe's handler runs Captum anyway and fails)."""
        raise PredictionException("the object_detector handler does not support explanations", 501)

    def postprocess(self, data: Any) -> list[list[dict[str, Any]]]:
        if isinstance(data, tuple):  # a scripted torchvision detector answers (losses, detections)
            data = data[-1]
        if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
            raise PredictionException(
                "the model's output is not one {boxes, labels, scores} dict per image"
            )
        return [self._objects(row) for row in data]

    def _objects(self, row: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
        keep = row["scores"] >= self.threshold
        boxes, labels, scores = (row[key][keep].tolist() for key in ("boxes", "labels", "scores"))
        found = []
        for label, box, score in zip(labels, boxes, scores, strict=True):
            item = map_class_to_label([[box]], self.mapping, [[label]])[0]
            item["score"] = score
            found.append(item)
        return found


def _takes_list(model: Any) -> bool:
    """Whether ``model`` is a TorchScript module whose ``forward`` takes a list of tensors."""
    schema = getattr(getattr(model, "forward", None), "schema", None)
    arguments = getattr(schema, "arguments", ())
    return len(arguments) > 1 and str(arguments[1].type).startswith("List[")
