"""The ``image_classifier`` built-in handler: PNG/JPEG in, top-k ``{label: prob}`` out.

Input per request: image bytes (raw body or a multipart field ``data``), a base64 string, or JSON
``{"data": "<base64>"}``; a JSON list is taken as an already-decoded float tensor (TorchServe).
An undecodable image, or one over PIL's ``MAX_IMAGE_PIXELS`` (decompression bomb; disabled when
``limit_max_image_pixels`` is false) as decoded or as ``resize`` would make it, fails only its own
request with 400.

Transforms (no torchvision), configured by ``model-config.yaml``'s ``image`` section (or
``handler: {image: ...}``), defaults in parentheses:

  resize (256)      int: shorter side to this, keeping aspect ratio; [h, w]: exact; null: none
  crop (224)        int or [h, w]: center crop; null: none
  grayscale (false) convert to one channel (same as channels: 1)
  channels (3)      1 or 3
  mean / std        per-channel normalization (ImageNet's; one value per channel)
  topk (5)          labels returned (also accepted at the top level of the section's parent)

Output: ``{label: prob}`` with labels from ``index_to_name.json`` (class index strings otherwise).
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from .base_handler import BaseHandler
from .classify import handler_config, topk_labels
from .errors import BadInput
from .runtime import explain

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def _size(value: Any) -> tuple[int, int] | int | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[1])
    return int(value)


class ImageClassifier(BaseHandler):
    """Image classification with ImageNet-style transforms (see the module docstring)."""

    topk = 5
    image_processing: Any = None  # TorchServe VisionHandler subclasses set a transform here

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        config = handler_config(context, "image")
        self.resize = _size(config.get("resize", 256))
        self.crop = _size(config.get("crop", 224))
        gray = bool(config.get("grayscale", False)) or int(config.get("channels", 3)) == 1
        self.channels = 1 if gray else 3
        mean = config.get("mean", IMAGENET_MEAN if self.channels == 3 else [0.5])
        std = config.get("std", IMAGENET_STD if self.channels == 3 else [0.5])
        self.mean = torch.tensor(mean, dtype=torch.float32).reshape(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).reshape(-1, 1, 1)
        top = config.get("topk", (context.model_yaml_config or {}).get("topk", self.topk))
        self.topk = int(top)
        if not context.system_properties.get("limit_max_image_pixels", True):
            Image.MAX_IMAGE_PIXELS = None
        if self.image_processing is None:  # TorchServe's subclasses call it on a PIL image
            self.image_processing = self.transform

    def set_max_result_classes(self, topk: int) -> None:
        self.topk = topk

    def get_max_result_classes(self) -> int:
        return self.topk

    def preprocess(self, data: list[Any]) -> torch.Tensor:
        images = self.map_items(data, self.load_item)
        return torch.stack(images).to(self.device, self.model_input_dtype)

    def explain_handle(self, data_preprocess: Any, raw_data: list[Any]) -> list[Any]:
        """One attribution per request that preprocessing kept, each for its own ``target``
        (TorchServe's handler takes the first request's target for the whole batch): the batch
        at once when they share it, else image by image."""
        targets = [explain.target_class(explain.target_of(raw_data[i])) for i in self.kept_indices]
        if len(set(targets)) == 1:
            return self.get_insights(data_preprocess, raw_data, targets[0])
        return [
            self.get_insights(data_preprocess[j : j + 1], raw_data, target)[0]
            for j, target in enumerate(targets)
        ]

    def get_insights(self, tensor_data: Any, raw_data: Any, target: Any) -> list[Any]:
        """Captum's Integrated Gradients per image, as TorchServe's VisionHandler (runtime/
        explain.py); 501 without Captum, 422 for a target the model has no class for."""
        target = explain.target_class(target)
        with self.model_errors():
            return explain.integrated_gradients(self.model, tensor_data, target)

    def load_item(self, row: Any) -> torch.Tensor:
        """One request's row -> a CHW float tensor; raises BadInput for an unusable image."""
        value = row.get("data") if isinstance(row, dict) else row
        if value is None and isinstance(row, dict):
            value = row.get("body")
        if isinstance(value, dict):
            value = value.get("data", value.get("image"))
        if isinstance(value, str):
            value = decode_base64(value)
        if isinstance(value, list):
            try:
                return torch.as_tensor(value, dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise BadInput(f"image list is not a numeric array: {exc}") from exc
        if not isinstance(value, (bytes, bytearray)) or not value:
            raise BadInput("no image in the request (send PNG/JPEG bytes or base64)")
        image = decode_image(bytes(value))
        processing = self.image_processing
        return (self.transform if processing is None else processing)(image)

    def transform(self, image: Image.Image) -> torch.Tensor:
        image = convert(image, "L" if self.channels == 1 else "RGB")
        if isinstance(self.resize, int):
            w, h = image.size
            scale = self.resize / min(w, h)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            check_pixels(size, f"a {w}x{h} image resized to {self.resize} on its shorter side")
            image = image.resize(size, Image.BILINEAR)
        elif self.resize is not None:
            image = image.resize((self.resize[1], self.resize[0]), Image.BILINEAR)
        if self.crop is not None:
            ch, cw = (self.crop, self.crop) if isinstance(self.crop, int) else self.crop
            w, h = image.size
            left, top = round((w - cw) / 2), round((h - ch) / 2)
            image = image.crop((left, top, left + cw, top + ch))  # pads with 0 when larger
        array = np.asarray(image, dtype=np.float32) / 255.0
        if array.ndim == 2:
            array = array[:, :, None]
        tensor = torch.from_numpy(array.transpose(2, 0, 1).copy())
        return (tensor - self.mean) / self.std

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        with self.model_errors():
            return super().inference(data, *args, **kwargs)

    def postprocess(self, data: torch.Tensor) -> list[dict[str, float]]:
        return topk_labels(data, self.topk, self.mapping)


# An object's default repr, which some PIL messages carry: internal detail, not for a client.
_OBJECT_REPR = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")


def decode_image(payload: bytes) -> Image.Image:
    """Decode and fully load an image; BadInput when undecodable or over MAX_IMAGE_PIXELS."""
    try:
        with warnings.catch_warnings():
            # Over the limit (but under 2x) PIL only warns: refuse it like a bomb.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(payload))
            image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadInput(f"image too large: {exc}") from exc
    except UnidentifiedImageError as exc:
        # PIL's message names the in-memory file object ("<_io.BytesIO object at 0x...>").
        raise BadInput("cannot decode image: not an image format this server reads") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise BadInput(f"cannot decode image: {_OBJECT_REPR.sub('the image', str(exc))}") from exc
    return image


# A data URL's head ("data:image/png;base64,"), which browsers' FileReader produce.
_DATA_URL = re.compile(r"data:[\w.+-]*/?[\w.+-]*(;[\w.+-]+=[\w.+-]+)*;base64,", re.ASCII)


def decode_base64(text: str) -> bytes:
    """An image sent as base64 text: whitespace (``base64``'s line breaks at 76 columns, a
    file's last newline) ignored as TorchServe's ``b64decode`` ignores it, an optional data
    URL head; BadInput when the rest is not base64."""
    text = "".join(text.split())
    head = _DATA_URL.match(text)
    try:
        return base64.b64decode(text[head.end() :] if head else text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadInput("image string is not valid base64") from exc


def convert(image: Image.Image, mode: str) -> Image.Image:
    """``image`` in ``mode`` ("RGB" or "L"), through RGB where PIL has no direct conversion
    (a CIELab TIFF to gray); BadInput when it has none at all."""
    try:
        return image.convert(mode)
    except ValueError:
        pass
    try:
        return image.convert("RGB").convert(mode)
    except ValueError as exc:
        raise BadInput(f"cannot convert a {image.mode} image to {mode}") from exc


def check_pixels(size: tuple[int, int], what: str) -> None:
    """BadInput when an image of ``size`` would pass PIL's ``MAX_IMAGE_PIXELS`` (the limit a
    decoded image keeps to, unless ``limit_max_image_pixels`` is false): a resize must not
    make a few bytes of a 1 x N image gigabytes."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit and size[0] * size[1] > limit:
        pixels = size[0] * size[1]
        raise BadInput(f"image too large: {what} is {pixels} pixels, over the limit of {limit}")
