"""Model directories in the SageMaker toolkit's layout (``model.pth`` + ``code/inference.py``),
made the same way for the TorchServe recording (record.py) and for torchbay's tests."""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
INPUT = [[1.0, 2.0, 3.0]]


def make_model_dir(dest: Path, scale: float = 1.0, code: str = "model") -> Path:
    """A model directory whose layer is ``scale`` times weights [[1,2,3],[4,5,6]], bias [.5,-.5]:
    INPUT gives [[14.5, 31.5]] at scale 1 (exact in float32, so answers compare as text).
    ``code``: the folder here whose ``code/inference.py`` it gets ("model", "transform"), with
    tiny_net.py beside it."""
    import torch

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(HERE / code / "code", dest / "code", dirs_exist_ok=True)
    shutil.copy(HERE / "tiny_net.py", dest / "code" / "tiny_net.py")  # its model and model_fn
    state = {
        "linear.weight": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]) * scale,
        "linear.bias": torch.tensor([0.5, -0.5]) * scale,
    }
    torch.save(state, dest / "model.pth")
    return dest
