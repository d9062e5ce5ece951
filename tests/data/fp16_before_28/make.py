"""Makes ``legacy-fp16.mar`` and ``legacy-bf16.mar``: fp16/bf16 TorchScript archives as torchbay's
archiver packed them before issue 28 (commit a82875a): the model wrapped in ``_Float32Io``
(float32 in and out) and a signature that declares FP32. ``tests/server/test_precision.py``
serves them to check that such archives keep serving as they did.

Run from the repository root at that commit (the archiver of today packs differently):

    .venv/bin/python tests/data/fp16_before_28/make.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from torchbay.archiver.package import ArchiveOptions, package

HERE = Path(__file__).resolve().parent
MODEL = """\
import torch
from torch import nn


class Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)
"""


def weights() -> dict[str, torch.Tensor]:
    """Weights exactly representable in fp16 and bf16, so answers can be checked by hand."""
    return {
        "fc.weight": torch.tensor(
            [[1.0, 0.5, -1.0, 2.0], [0.25, -0.5, 1.0, 0.0], [-2.0, 1.0, 0.5, 0.25]]
        ),
        "fc.bias": torch.tensor([0.5, -0.25, 1.0]),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "affine.py").write_text(MODEL)
        torch.save(weights(), work / "affine.pt")
        torch.save(torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 0.25, 2.0]]), work / "x.pt")
        for precision in ("fp16", "bf16"):
            package(
                ArchiveOptions(
                    model_name=f"legacy-{precision}",
                    version="1.0",
                    handler="tensor",
                    model_file=work / "affine.py",
                    serialized_file=work / "affine.pt",
                    example_input=work / "x.pt",
                    convert="torchscript-trace",
                    precision=precision,
                    export_path=HERE,
                    force=True,
                )
            )


if __name__ == "__main__":
    main()
