"""The workflow's first node: a 32x32 grayscale scan in, the 8x8 PNG the digits model reads out.

The model (a 4x4 average pool, TorchScript, built in code by build.py) averages away the scan's
noise; the handler writes its output as an 8-bit PNG, which the next node decodes as an upload.
"""

import io

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException

SIDE = 32


class ShrinkHandler(BaseHandler):
    def _scan(self, row):
        data = row.get("body")
        if not isinstance(data, (bytes, bytearray)):
            raise PredictionException("send a 32x32 grayscale PNG", 400)
        try:
            image = Image.open(io.BytesIO(data))  # the header: its size, no pixels yet
            size = image.size
        except Image.DecompressionBombError:  # a header past PIL's pixel limit: not a scan
            size = None
        except (UnidentifiedImageError, OSError) as exc:
            raise PredictionException(f"cannot decode image: {type(exc).__name__}", 400) from None
        if size != (SIDE, SIDE):  # refused before its pixels are decoded
            raise PredictionException(f"the scan must be {SIDE}x{SIDE}, got {size}", 422)
        try:
            image = image.convert("L")
        except OSError as exc:  # truncated or corrupt pixel data
            raise PredictionException(f"cannot decode image: {type(exc).__name__}", 400) from None
        return torch.from_numpy(np.asarray(image, dtype=np.float32)).unsqueeze(0)

    def preprocess(self, data):
        return torch.stack(self.map_items(data, self._scan))

    def postprocess(self, small):
        out = []
        for pixels in small[:, 0].round().clamp(0, 255).to(torch.uint8).numpy():
            buf = io.BytesIO()
            Image.fromarray(pixels, "L").save(buf, format="PNG")
            out.append(buf.getvalue())
        for idx in self.kept_indices:
            self.context.set_response_content_type(idx, "image/png")
        return out
