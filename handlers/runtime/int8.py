"""The ``int8-dynamic`` recipe: dynamic int8 quantization of Linear layers with plain tensors.

torch 2.13 deprecates ``torch.ao.quantization.quantize_dynamic`` and the quantized tensor dtypes
(qint8, quint8) it stores weights in; the supported replacement, torchao, builds on tensor
subclasses that TorchScript cannot trace. This module does the same arithmetic with ordinary
tensors and aten ops only (so TorchScript, torch.export and a plain state dict all take it):

* weights: int8, symmetric, one scale per output channel, computed once at conversion;
* activations: int8, symmetric, one scale per row, computed at run time (the "dynamic" part);
* ``torch._int_mm`` multiplies int8 by int8 into int32, rescaled to float32, plus the bias.

The archiver (``archiver.convert.quantize_int8``) and the eager loader (``handlers.loading``,
through ``quantize_for_state``) both use ``quantize_linear``, so an int8 state dict loads into
exactly the module it came from; eager archives made with torch.ao's recipe before still load.
CPU only, as torch's dynamic quantization was (``_int_mm`` on CUDA needs aligned shapes).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

__all__ = ["Int8DynamicLinear", "quantize_for_state", "quantize_linear"]

_QMAX = 127.0


class Int8DynamicLinear(nn.Module):
    """``y = x @ W.T + b`` with W in int8 (per output channel) and x quantized per row."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features))

    @classmethod
    def from_float(cls, linear: nn.Linear) -> Int8DynamicLinear:
        module = cls(linear.in_features, linear.out_features)
        with torch.no_grad():
            w = linear.weight.detach().float()
            scale = w.abs().amax(dim=1).clamp(min=1e-12) / _QMAX
            module.weight.copy_(torch.round(w / scale[:, None]).clamp(-_QMAX, _QMAX))
            module.weight_scale.copy_(scale)
            if linear.bias is not None:
                module.bias.copy_(linear.bias.detach().float())
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        # Literals, not _QMAX: torch.jit.script cannot read module globals.
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        q = torch.round(rows / scale).clamp(-127.0, 127.0).to(torch.int8)
        acc = torch._int_mm(q, self.weight.t())
        y = acc.float() * scale * self.weight_scale + self.bias
        # (not [*shape, n]: torch.jit.script has no starred lists)
        return y.reshape(list(x.shape[:-1]) + [self.out_features])  # noqa: RUF005

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linear(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by an ``Int8DynamicLinear``."""
    if isinstance(model, nn.Linear):
        return Int8DynamicLinear.from_float(model)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8DynamicLinear.from_float(child))
        else:
            quantize_linear(child)
    return model


def quantize_for_state(model: nn.Module, state: Any = None) -> nn.Module:
    """The int8 module ``state`` (an int8-dynamic state dict) was saved from: this recipe, or,
    for an eager archive made before it, torch.ao's dynamic quantization (its state dict holds
    ``_packed_params``), kept only so those archives still load."""
    if isinstance(state, dict) and any("_packed_params" in str(key) for key in state):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.ao is deprecated
            return torch.ao.quantization.quantize_dynamic(
                model, {nn.Linear, nn.LSTM}, dtype=torch.qint8
            )
    return quantize_linear(model)
