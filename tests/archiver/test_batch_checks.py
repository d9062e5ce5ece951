"""The parity check on outputs that are not finite: a reference with infinite outputs of its own
packs; a conversion that overflows is refused as not finite."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchbay.archiver.errors import ParityError
from torchbay.archiver.manifest import read_manifest
from torchbay.archiver.package import package

from .conftest import tensor_options

MODELS = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 3)
        self.register_buffer("table", torch.arange(5, dtype=torch.float32))
        self.register_buffer("mask", torch.tensor([0.0, 0.0, float("-inf")]))

    def forward(self, x):
        y = self.l(x)
        if KIND == "scalar":
            return y, y.sum()
        if KIND == "table":
            return y, self.table * 1.0
        if KIND == "loop":  # a trace unrolls this for the example's batch size
            return torch.cat([self.l(x[i : i + 1]) for i in range(x.shape[0])])
        return y + self.mask  # "masked": a column that is always -inf
"""


def _folder(tmp_path: Path, kind: str) -> Path:
    """``net.py`` (the ``kind`` of Net), its state dict and a 4-row example, in a folder."""
    folder = tmp_path / kind
    folder.mkdir()
    source = MODELS.replace("KIND ==", f"{kind!r} ==")
    (folder / "net.py").write_text(source)
    namespace: dict = {}
    exec(compile(source, "net.py", "exec"), namespace)
    torch.manual_seed(0)
    torch.save(namespace["Net"]().state_dict(), folder / "net.pt")
    torch.save(torch.randn(4, 4), folder / "x.pt")
    return folder


@pytest.mark.parametrize("convert", ["none", "export"])
def test_a_reference_with_infinite_outputs_of_its_own_packs(tmp_path: Path, convert: str) -> None:
    """A masked logit is -inf in the reference and in the packed model alike: no drift."""
    folder = _folder(tmp_path, "masked")
    options = tensor_options("masked", folder, "net.py", "net.pt", "x.pt", convert=convert)
    parity = read_manifest(package(options)).torchbay.parity
    assert parity.passed and parity.max_abs_error == 0.0


def test_an_fp16_overflow_is_refused_as_not_finite(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "masked")
    source = (folder / "net.py").read_text().replace("return y + self.mask", "return y * 1e5")
    (folder / "net.py").write_text(source)
    options = tensor_options("big", folder, "net.py", "net.pt", "x.pt", precision="fp16")
    with pytest.raises(ParityError, match="not finite"):
        package(options)
