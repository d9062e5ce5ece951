"""A per-pixel colour detector: a 1x1 convolution scoring each pixel as background/red/green/blue.

Small enough to train in a second on synthetic scenes (build.py); the handler turns its score map
into boxes, as a detection model's post-processing turns anchors into boxes.
"""

from __future__ import annotations

import torch
from torch import nn

CLASSES = ["background", "red", "green", "blue"]


class ColorBlobNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pixel = nn.Sequential(nn.Conv2d(3, 16, 1), nn.ReLU(), nn.Conv2d(16, len(CLASSES), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [0, 1] -> class probabilities [B, 4, H, W]."""
        return torch.softmax(self.pixel(x), dim=1)
