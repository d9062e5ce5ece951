"""An object-detection-style handler: image in, a JSON list of boxes out.

Response per image: ``[{"label": "red", "score": 0.98, "box": [x0, y0, x1, y1]}, ...]`` (pixel
coordinates, x1/y1 exclusive), largest first; an image with nothing in it answers ``[]``. The
model scores each pixel; connected regions of one class larger than ``min_area`` pixels become
boxes, scored by the mean probability inside them. Settings (``model-config.yaml``, section
``handler``): ``min_area`` (default 16), ``max_side`` (default 512: larger images are refused with
413 before they reach the model).
"""

from collections import deque

import numpy as np
import torch
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException

CLASSES = ["background", "red", "green", "blue"]


def regions(mask: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """Connected regions (4-neighbour) of a boolean mask: (x0, y0, x1, y1, area) each."""
    seen = np.zeros_like(mask, dtype=bool)
    height, width = mask.shape
    found = []
    for y, x in zip(*np.nonzero(mask), strict=True):
        if seen[y, x]:
            continue
        seen[y, x] = True
        queue, xs, ys = deque([(y, x)]), [x], [y]
        while queue:
            cy, cx = queue.popleft()
            for ny, nx in ((cy - 1, cx), (cy + 1, cx), (cy, cx - 1), (cy, cx + 1)):
                if 0 <= ny < height and 0 <= nx < width and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
                    xs.append(nx)
                    ys.append(ny)
        found.append((min(xs), min(ys), max(xs) + 1, max(ys) + 1, len(xs)))
    return found


class DetectionHandler(BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        config = (context.model_yaml_config or {}).get("handler", {})
        self.min_area = int(config.get("min_area", 16))
        self.max_side = int(config.get("max_side", 512))

    def _image(self, request):
        import io

        from PIL import Image, UnidentifiedImageError

        data = request.get("data") if request.get("data") is not None else request.get("body")
        if not isinstance(data, (bytes, bytearray)):
            raise PredictionException("send a PNG or JPEG image as the request body", 400)
        too_large = PredictionException(f"image larger than {self.max_side} pixels a side", 413)
        try:
            image = Image.open(io.BytesIO(data))  # reads the header: the size, no pixels yet
        except Image.DecompressionBombError:  # a header past PIL's own pixel limit
            raise too_large from None
        except (UnidentifiedImageError, OSError) as exc:
            raise PredictionException(f"cannot decode image: {type(exc).__name__}", 400) from None
        if max(image.size) > self.max_side:  # refused before its pixels are decoded
            raise too_large
        try:
            image = image.convert("RGB")
        except OSError as exc:  # truncated or corrupt pixel data
            raise PredictionException(f"cannot decode image: {type(exc).__name__}", 400) from None
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        return torch.from_numpy(pixels).permute(2, 0, 1)

    def preprocess(self, data):
        return self.map_items(data, self._image)  # a list: images may differ in size

    def inference(self, images):
        with torch.inference_mode():
            return [self.model(image.unsqueeze(0).to(self.device))[0].cpu() for image in images]

    def postprocess(self, prob_maps):
        return [self._boxes(probs) for probs in prob_maps]

    def _boxes(self, probs):
        best = probs.argmax(0).numpy()
        boxes = []
        for cls in range(1, len(CLASSES)):
            for x0, y0, x1, y1, area in regions(best == cls):
                if area < self.min_area:
                    continue
                score = float(probs[cls, y0:y1, x0:x1][best[y0:y1, x0:x1] == cls].mean())
                box = {"label": CLASSES[cls], "score": round(score, 4), "box": [x0, y0, x1, y1]}
                boxes.append((area, box))
        return [box for _, box in sorted(boxes, key=lambda pair: -pair[0])]
