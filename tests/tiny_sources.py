"""The model file of an eager archive (``--model-file``): a module holding one ``Tiny``
``nn.Module`` of one Linear(4, 3) layer, whose state dict is the archive's ``--serialized-file``.
Shared by the handler tests and the live TorchServe-archive tests; :func:`saved_model` writes
any such model file and its state dict."""

from __future__ import annotations

from pathlib import Path

import torch

TINY_LINEAR_SOURCE = """
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)
"""


def saved_model(folder: Path, file_name: str, source: str, cls: str, state: str) -> torch.nn.Module:
    """``source`` written to ``folder/file_name`` (an archive's ``--model-file``), its class
    ``cls`` built with seed 0 and its state dict saved to ``folder/state`` (the
    ``--serialized-file``); the model, in eval mode, to compare answers with."""
    (folder / file_name).write_text(source)
    namespace: dict = {}
    exec(compile(source, file_name, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace[cls]().eval()
    torch.save(model.state_dict(), folder / state)
    return model
