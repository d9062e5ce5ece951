"""The baseline's handler for the reference models: raw float32 bodies in, top-1 class out.
Standalone (archived with ``--handler``; only the BaseHandler API), so it runs unchanged under
torchbay and TorchServe. Each body is copied once into a batch buffer reused across batches. The
sample shape: ``input_shape.json`` in the model directory, else the model name; threads: 1 unless
``model-config.yaml`` sets ``handler: {num_threads: N}``."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import torch

try:
    from torchbay.handlers.base_handler import BaseHandler
except ImportError:  # running under TorchServe
    from ts.torch_handler.base_handler import BaseHandler

SAMPLE_SHAPES: dict[str, tuple[int, ...]] = {"tiny": (64,), "cnn": (3, 64, 64)}
SHAPE_FILE = "input_shape.json"


def resolve_shape(model_name: str, model_dir: str | None) -> tuple[int, ...]:
    """The shape of one sample: ``input_shape.json`` in ``model_dir`` wins over the name table."""
    path = os.path.join(model_dir or "", SHAPE_FILE)
    if model_dir and os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return tuple(int(d) for d in json.load(fh)["shape"])
    if model_name in SAMPLE_SHAPES:
        return SAMPLE_SHAPES[model_name]
    raise ValueError(f"no sample shape for model {model_name!r}: add {SHAPE_FILE} to the archive")


def decode_batch(
    requests: list[dict], shape: tuple[int, ...], buffer: np.ndarray | None = None
) -> torch.Tensor:
    """The batch of one float32 sample per request, copied into ``buffer`` (:func:`grow_buffer`)
    and sharing its memory. A body of the wrong size raises ValueError."""
    count, n = math.prod(shape), len(requests)
    expected, buffer = 4 * count, grow_buffer(buffer, n, count)
    for i, row in enumerate(requests):
        body = row["data"] if row.get("data") is not None else row.get("body")
        if not isinstance(body, (bytes, bytearray, memoryview)) or len(body) != expected:
            raise ValueError(f"expected a raw float32 body of {expected} bytes")
        buffer[i] = np.frombuffer(body, dtype="<f4")
    return torch.from_numpy(buffer[:n]).view(n, *shape)


def grow_buffer(buffer: np.ndarray | None, rows: int, count: int) -> np.ndarray:
    """``buffer`` when it holds ``rows`` samples of ``count`` floats, else a larger new one."""
    if buffer is not None and buffer.shape[0] >= rows and buffer.shape[1] == count:
        return buffer
    return np.empty((rows, count), dtype=np.float32)


def top1(logits: torch.Tensor) -> list[dict]:
    """One ``{"class": k, "score": s}`` per row of ``logits``."""
    scores, classes = torch.softmax(logits, dim=1).max(dim=1)
    pairs = zip(classes.tolist(), scores.tolist(), strict=True)
    return [{"class": k, "score": s} for k, s in pairs]


class RawTensorHandler(BaseHandler):
    """Raw float32 bodies -> TorchScript model -> top-1 class and score per request."""

    def initialize(self, context) -> None:
        handler = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        torch.set_num_threads(int(handler.get("num_threads", 1)))
        super().initialize(context)
        model_name = context.manifest["model"]["modelName"]
        self.sample_shape = resolve_shape(model_name, context.system_properties.get("model_dir"))
        self._count = math.prod(self.sample_shape)
        self._buffer: np.ndarray | None = None

    def preprocess(self, data: list[dict]) -> torch.Tensor:
        # One buffer per worker, reused: a batch is done (postprocess) before the next decodes.
        self._buffer = grow_buffer(self._buffer, len(data), self._count)
        return decode_batch(data, self.sample_shape, self._buffer)

    def inference(self, data: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        run_model = getattr(self, "run_model", None)
        if run_model is not None:  # torchbay: BaseHandler's device path (handlers/runtime/accel.py)
            return run_model(data)
        device = getattr(self, "device", None)
        with torch.inference_mode():
            return self.model(data if device is None else data.to(device))

    postprocess = staticmethod(top1)
