"""The torch models behind Triton's example models (the ones its client examples call).

Each computes what the Triton model of the same name computes (server repository
``docs/examples/model_repository`` and ``qa/``): ``AddSub`` is ``simple`` / ``simple_int8`` /
``simple_string`` (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, in the inputs' dtype);
``TinyClassifier`` stands in for ``densenet_onnx`` and ``inception_graphdef``: an image
classifier of the same input layout and class count, with random but seeded weights, since the
examples check only that the answer is a well-formed top-k, not which class wins.
"""

from __future__ import annotations

import torch
from torch import nn


class AddSub(nn.Module):
    """Triton's ``simple``: the sum and the difference of two tensors of one shape."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class TinyClassifier(nn.Module):
    """An image classifier of ``classes`` classes: two strided convolutions, a global average
    pool and a linear layer, so any image size works and a 224x224 image costs ~1 ms on a CPU.
    Takes a batch; ``channels_last``: of NHWC images (TensorFlow's layout, ``inception_graphdef``),
    else NCHW. A model declared without a batch dimension (``densenet_onnx``, Triton's
    max_batch_size 0) still gets one: the tensor handler runs each request as a batch of one.
    """

    def __init__(self, classes: int, *, channels_last: bool) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=7, stride=4),
            nn.ReLU(),
            nn.Conv2d(8, 16, kernel_size=3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return torch.softmax(self.head(self.features(x)), dim=1)


class Identity(nn.Module):
    """Triton's ``custom_identity_int32``: its input, unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
