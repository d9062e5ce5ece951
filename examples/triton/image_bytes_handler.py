"""The handler of ``preprocess_inception_ensemble``: encoded image files in, class scores out.

In Triton this model is an ensemble: a preprocessing model decodes each JPEG/PNG, resizes it to
299x299 and scales it to [-1, 1] (Inception's scaling), and ``inception_graphdef`` classifies it.
torchbay serves no ensembles; one handler does both steps here, over the same classifier
(``models.TinyClassifier``, NHWC). Input ``INPUT``: BYTES [batch, 1], one encoded image per
row; output ``OUTPUT``: FP32 [batch, 1001], labelled by the archive's ``index_to_name.json`` when
a client asks for ``classification``. An image that does not decode is the client's error: 400.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from torchbay.handlers.base_handler import BaseHandler
from torchbay.handlers.errors import BadInput

SIZE = 299


def decode(data: Any) -> np.ndarray:
    """One encoded image as an HWC float32 array, resized and scaled as Inception expects."""
    if not isinstance(data, (bytes, bytearray)):  # a JSON string: not an image file
        raise BadInput("INPUT must be binary data (an encoded image file)")
    try:
        image = Image.open(io.BytesIO(data)).convert("RGB")
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as exc:
        raise BadInput(f"INPUT is not an image file ({type(exc).__name__})") from None
    pixels = np.asarray(image.resize((SIZE, SIZE), Image.BILINEAR), dtype=np.float32)
    return pixels / 127.5 - 1.0


class ImageBytesHandler(BaseHandler):
    supports_v2 = True

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        return [self._answer(row) for row in data]

    def _answer(self, row: Any) -> Any:
        if not isinstance(row, dict) or row.get("protocol") != "v2":
            raise BadInput("this model answers the Open Inference Protocol (/v2/models/...)")
        images = row["body"]["inputs"][0]["array"].ravel()
        batch = np.stack([decode(item) for item in images])
        with torch.inference_mode():
            scores = self.model(torch.from_numpy(batch).to(self.device)).cpu().numpy()
        return {
            "outputs": [
                {"name": "OUTPUT", "datatype": "FP32", "shape": list(scores.shape), "array": scores}
            ]
        }
