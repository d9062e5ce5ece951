"""The model of every ``code/inference.py`` here, copied into each model directory's ``code/``
beside it (model_dirs.py; the toolkit puts ``code/`` on the path): a 3 -> 2 linear layer whose
state dict ``model.pth`` holds, and the ``model_fn`` that loads it."""

import os

import torch


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.linear(x)


def model_fn(model_dir):
    model = TinyNet()
    state = torch.load(os.path.join(model_dir, "model.pth"), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()
