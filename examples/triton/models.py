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
    max_batch_size 0) gets each request's image whole (``[3, 224, 224]``) and answers its scores
    whole (``[1000]``): the model adds and removes the batch of one itself, as Triton's
    densenet_onnx config does with ``reshape``.
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
        whole = x.dim() == 3  # one image, no batch dimension
        if whole:
            x = x.unsqueeze(0)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        scores = torch.softmax(self.head(self.features(x)), dim=1)
        return scores.squeeze(0) if whole else scores


class SimpleSequence(nn.Module):
    """Triton's ``simple_sequence``: OUTPUT = INPUT + START, where START (1 on a sequence's first
    request, else 0) and READY are control inputs the server fills for each request of a
    sequence; its sequence client examples expect exactly that."""

    def forward(
        self, value: torch.Tensor, start: torch.Tensor, ready: torch.Tensor
    ) -> torch.Tensor:
        return value + start * ready


class Identity(nn.Module):
    """Triton's ``custom_identity_int32``: its input, unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
