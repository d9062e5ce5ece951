"""A tiny text classifier in TorchServe's text_classifier layout: an ``EmbeddingBag`` called
``embedding`` (TorchServe's handler attributes over ``model.embedding``) and a linear layer,
``forward(text, offsets)``. Built with no arguments, as TorchServe's base handler builds it."""

import torch

VOCAB = 16  # ids of vocab.json / source_vocab.pt (record.py)


class TextModel(torch.nn.Module):
    def __init__(self, vocab_size=VOCAB, embed_dim=4, num_class=2):
        super().__init__()
        self.embedding = torch.nn.EmbeddingBag(vocab_size, embed_dim)
        self.fc = torch.nn.Linear(embed_dim, num_class)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))
