"""A model whose path depends on its input's values (data-dependent control flow), as users
convert it: torch.export refuses it in one line that names the line of the model and the way out
(no graph dump on stderr).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .conftest import run_torchbay

BRANCHY = """\
import torch
from torch import nn


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 3)

    def forward(self, x):
        if x.sum() > 0:
            return self.l(x)
        return -self.l(x)
"""


def _folder(tmp_path: Path) -> Path:
    """branchy.py, its state dict and an example whose every row (and sum) is positive."""
    (tmp_path / "branchy.py").write_text(BRANCHY)
    namespace: dict = {}
    exec(compile(BRANCHY, "branchy.py", "exec"), namespace)
    torch.manual_seed(0)
    torch.save(namespace["Branchy"]().state_dict(), tmp_path / "branchy.pt")
    torch.save(torch.rand(4, 4) + 0.1, tmp_path / "x.pt")
    return tmp_path


def _archive(folder: Path, convert: str):
    return run_torchbay(
        *("archive", "--model-name", "branchy", "--version", "1", "--handler", "tensor"),
        *("--model-file", "branchy.py", "--serialized-file", "branchy.pt"),
        *("--example-input", "x.pt", "--convert", convert),
        cwd=folder,
    )


def test_export_of_data_dependent_control_flow_is_one_line(tmp_path: Path) -> None:
    """torch.export printed the partial graph twice and a warning (22 lines) before the error,
    and pointed to torchscript-trace, which keeps the example's branch only."""
    result = _archive(_folder(tmp_path), "export")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "torchbay: error: torch.export failed (data-dependent control flow; try --convert "
        "torchscript-script, or none): Could not guard on data-dependent expression "
        f"{_guard_text(result.stderr)} (at branchy.py line 11: if x.sum() > 0:)"
    ]
    assert not (tmp_path / "branchy.mar").exists()


def _guard_text(stderr: str) -> str:
    """torch's own words between 'expression ' and the location (they vary with its version)."""
    return stderr.split("data-dependent expression ", 1)[1].rsplit(" (at branchy.py", 1)[0]
