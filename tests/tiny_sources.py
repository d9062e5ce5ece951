"""The model file of an eager archive (``--model-file``): a module holding one ``Tiny``
``nn.Module`` of one Linear(4, 3) layer, whose state dict is the archive's ``--serialized-file``.
Shared by the handler tests and the live TorchServe-archive tests."""

TINY_LINEAR_SOURCE = """
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)
"""
