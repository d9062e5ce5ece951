"""A bag-of-embeddings text classifier (TorchServe's text-classification example's shape).

forward(tokens, offsets): ``tokens`` holds every request's token ids end to end, ``offsets`` where
each request starts; the built-in ``text_classifier`` handler builds both (``input: offsets``).
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB_SIZE = 256  # room for the vocabulary build.py writes (unused rows stay untrained)
DIM = 24
CLASSES = 3


class BagOfWords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(VOCAB_SIZE, DIM, mode="mean")
        self.classifier = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embedding(tokens, offsets))
