"""A model file that imports a module of its own, shipped with --extra-files as TorchServe's
examples do: the archiver imports it from what the archive holds, as the worker does (the
archive's folder on sys.path), for the conversion and the parity check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchbay.archiver.errors import ArchiveArgumentError
from torchbay.archiver.package import package
from torchbay.handlers.testing import run_handler

from .conftest import tensor_options

HELPER = "import torch\n\n\ndef act(x):\n    return torch.relu(x) * 2\n"
NET = """\
from torch import nn

from act_helper import act


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 3)

    def forward(self, x):
        return act(self.l(x))
"""


def _folder(tmp_path: Path, helper: str = "act_helper") -> Path:
    """net.py importing ``helper`` (named apart per test: a worker run in this process keeps
    the modules it imported), helper.py beside it, the state dict and an example."""
    (tmp_path / f"{helper}.py").write_text(HELPER)
    (tmp_path / "net.py").write_text(NET.replace("act_helper", helper))
    torch.manual_seed(0)
    torch.save({"l.weight": torch.randn(3, 4), "l.bias": torch.randn(3)}, tmp_path / "net.pt")
    torch.save(torch.randn(2, 4), tmp_path / "x.pt")
    return tmp_path


@pytest.mark.parametrize("convert", ["none", "export"])
def test_a_model_importing_its_extra_file_packs_and_serves(tmp_path: Path, convert: str) -> None:
    """It was refused: importing 'net.py' failed: ModuleNotFoundError("No module named
    'act_helper'"), though act_helper.py was given with --extra-files."""
    folder = _folder(tmp_path)
    extra = str(folder / "act_helper.py")
    mar = package(
        tensor_options(
            "net", folder, "net.py", "net.pt", "x.pt", convert=convert, extra_files=extra
        )
    )
    x = torch.tensor([[1.0, -2.0, 3.0, -4.0]])
    state = torch.load(folder / "net.pt")
    expected = torch.relu(x @ state["l.weight"].T + state["l.bias"]) * 2
    replies = run_handler(mar, [x.numpy().astype("<f4").tobytes()])
    assert replies[0].status == 200, replies[0].body
    assert replies[0].json()["output"] == pytest.approx(expected[0].tolist(), rel=1e-5)


def test_a_module_left_out_of_the_archive_is_named(tmp_path: Path) -> None:
    """Beside the model file is not in the archive: the worker would not find it either."""
    folder = _folder(tmp_path, "left_out_helper")
    with pytest.raises(ArchiveArgumentError, match="No module named 'left_out_helper'") as caught:
        package(tensor_options("net", folder, "net.py", "net.pt", "x.pt", convert="export"))
    assert "--extra-files" in str(caught.value)
    assert not (folder / "net.mar").exists()
