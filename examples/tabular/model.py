"""The iris MLP in torch: standardization folded in, then scikit-learn's MLP layers (ReLU)."""

from __future__ import annotations

import torch
from torch import nn

FEATURES = 4
HIDDEN = 16
CLASSES = 3


class IrisMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # StandardScaler's mean and scale, as buffers so they travel in the state dict.
        self.register_buffer("mean", torch.zeros(FEATURES))
        self.register_buffer("scale", torch.ones(FEATURES))
        self.hidden = nn.Linear(FEATURES, HIDDEN)
        self.out = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.scale
        return self.out(torch.relu(self.hidden(x)))
