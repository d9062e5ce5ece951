"""The model store of the OIP metadata and Triton extension tests (test_oip_metadata.py,
test_triton.py): every archive built by our archiver, with a recorded signature."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from torchbay.archiver.package import ArchiveOptions, package

OVERRIDE_YAML = """\
batchSize: 2
inputs:
  - {name: pixels, datatype: FP32, shape: [-1, 8, 8]}
"""
IMAGE_YAML = """\
inputs:
  - {name: image, datatype: FP32, shape: [-1, 1, 8, 8], format: FORMAT_NCHW}
"""
FLAT_YAML = """\
inputs:
  - {name: features, datatype: FP32, shape: [64]}
"""
BAD_YAML = """\
inputs:
  - {name: x, datatype: FLOAT, shape: [-1, 64]}
"""


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 5)
        self.b = nn.Linear(3, 5)

    def forward(
        self, features: torch.Tensor, extra: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.a(features) + self.b(extra)
        return y, y.argmax(dim=1)


def build_oip_store(root: Path, work: Path) -> Path:
    """A model store, every archive built by our archiver with an example input:
    ``one`` (64 -> 10, tensor handler), ``two`` (inputs features [-1,64] and extra [-1,3],
    outputs FP32 [-1,5] and INT64 [-1]), ``over`` (``one`` with a model-config.yaml signature
    override) and ``badsig`` (``one`` with an invalid override)."""
    torch.manual_seed(0)
    one = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    torch.jit.save(torch.jit.script(one), str(work / "one.pt"))
    torch.jit.save(torch.jit.script(_TwoInputs().eval()), str(work / "two.pt"))
    torch.save(torch.randn(4, 64), work / "one_example.pt")
    # Keys out of forward's order: the archive takes forward's order.
    torch.save({"extra": torch.randn(4, 3), "features": torch.randn(4, 64)}, work / "two_ex.pt")
    (work / "over").mkdir()
    (work / "over" / "model-config.yaml").write_text(OVERRIDE_YAML)
    (work / "bad").mkdir()
    (work / "bad" / "model-config.yaml").write_text(BAD_YAML)
    for folder, text in (("image", IMAGE_YAML), ("flat", FLAT_YAML)):
        (work / folder).mkdir()
        (work / folder / "model-config.yaml").write_text(text)
    specs = {
        "one": ("one.pt", "one_example.pt", None),
        "two": ("two.pt", "two_ex.pt", None),
        "over": ("one.pt", "one_example.pt", work / "over" / "model-config.yaml"),
        "badsig": ("one.pt", "one_example.pt", work / "bad" / "model-config.yaml"),
        # Triton's model configuration: a declared image format; no batch dimension
        "image": ("one.pt", "one_example.pt", work / "image" / "model-config.yaml"),
        "flat": ("one.pt", "one_example.pt", work / "flat" / "model-config.yaml"),
    }
    for name, (model, example, config) in specs.items():
        package(
            ArchiveOptions(
                model_name=name,
                version="1.0",
                handler="tensor",
                serialized_file=work / model,
                example_input=work / example,
                config_file=config,
                export_path=root,
            )
        )
    return root
