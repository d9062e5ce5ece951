"""The handler of Triton's BYTES example models: ``simple_string`` and ``simple_identity``.

Torch has no string tensors, so the strings are converted here, around the model. With a model in
the archive (``simple_string``), each input's elements are decimal integers ("1", "-3"): they
become INT32 tensors, the model (``models.AddSub``) runs on them, and each output element is
written back as its decimal string, as Triton's ``simple_string`` answers. Without a model
(``simple_identity``, a Python-backend model in Triton) each output is its input, unchanged.

Only the Open Inference Protocol reaches this handler usefully (``supports_v2``): the tensors
arrive decoded (a BYTES tensor as a flat object array of ``bytes`` or ``str``), matched to the
model-config.yaml ``inputs`` by name and in their order; the outputs are named by its
``outputs``, in order. A non-numeric string for ``simple_string`` is the client's error: 400.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from torchbay.handlers.base_handler import BaseHandler
from torchbay.handlers.errors import BadInput


def _as_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def to_int32(tensor: dict[str, Any]) -> torch.Tensor:
    """One BYTES input (``{"name", "shape", "array"}``) as an INT32 tensor of its shape."""
    try:
        numbers = [int(_as_text(v)) for v in tensor["array"].ravel()]
        return torch.tensor(numbers, dtype=torch.int32).reshape(tensor["shape"])
    except (ValueError, OverflowError, RuntimeError):  # not a number, or not an INT32
        name = tensor["name"]
        raise BadInput(f"input {name!r}: every element must be a decimal INT32") from None


def to_bytes(name: str, values: torch.Tensor) -> dict[str, Any]:
    """One output: the decimal string of each element, as a BYTES tensor of ``values``' shape."""
    strings = np.empty(values.numel(), dtype=object)  # np.array would make a fixed-width |S
    strings[:] = [str(v).encode() for v in values.flatten().tolist()]  # .tolist() leaves a GPU
    shape = list(values.shape)
    return {"name": name, "datatype": "BYTES", "shape": shape, "array": strings.reshape(shape)}


class BytesHandler(BaseHandler):
    """BYTES in, BYTES out; see the module docstring."""

    supports_v2 = True

    def initialize(self, context: Any) -> None:
        super().initialize(context)  # self.model: None when the archive has no serialized file
        config = getattr(context, "model_yaml_config", None) or {}
        self.output_names = [spec["name"] for spec in config.get("outputs") or []]

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        return [self._answer(row) for row in data]

    def _answer(self, row: Any) -> Any:
        if not isinstance(row, dict) or row.get("protocol") != "v2":
            raise BadInput("this model answers the Open Inference Protocol (/v2/models/...)")
        inputs = row["body"]["inputs"]
        if self.model is None:  # identity
            outputs = [
                {"name": name, "datatype": t["datatype"], "shape": t["shape"], "array": t["array"]}
                for name, t in zip(self.output_names, inputs, strict=False)
            ]
            return {"outputs": outputs}
        with torch.inference_mode():  # on the worker's device (a GPU's when it has one)
            results = self.model(*[to_int32(t).to(self.device) for t in inputs])
        return {
            "outputs": [to_bytes(n, r) for n, r in zip(self.output_names, results, strict=True)]
        }
