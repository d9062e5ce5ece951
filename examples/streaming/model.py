"""A word bigram language model: next-token logits are a lookup in a [V, V] table.

build.py fills the table in code with log-probabilities counted on the Zen of Python (which
Python itself ships, as the ``this`` module): no training, no download.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB_SIZE = 128  # room for the Zen's vocabulary (unused rows stay at -inf-like logits)


class Bigram(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(VOCAB_SIZE, VOCAB_SIZE)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B] -> next-token logits [B, V]."""
        return self.table(ids)
