"""A model whose path depends on its input's values (data-dependent control flow), as users
convert it: torch.export refuses it in one line that names the line of the model and the way out
(no graph dump on stderr); a trace, which would keep the example's path only, is refused; a
scripted model packs and serves both paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.tiny_sources import saved_model
from torchbay.handlers.testing import run_handler

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
    saved_model(tmp_path, "branchy.py", BRANCHY, "Branchy", "branchy.pt")
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


def test_a_trace_that_keeps_the_examples_branch_only_is_refused(tmp_path: Path) -> None:
    """The trace served the example's branch for every input (a negative row answered as if
    positive): the parity check, run on the example's own rows, passed it."""
    result = _archive(_folder(tmp_path), "torchscript-trace")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "torchbay: error: torch.jit.trace keeps the example's path only, and the model takes "
        "another on other inputs (data-dependent control flow): use --convert "
        "torchscript-script or export, or none"
    ]
    assert not (tmp_path / "branchy.mar").exists()


def test_a_scripted_branch_packs_and_answers_the_other_path(tmp_path: Path) -> None:
    """The way out the errors name: scripting keeps both branches."""
    folder = _folder(tmp_path)
    result = _archive(folder, "torchscript-script")
    assert result.returncode == 0, result.stderr
    negative = -(torch.rand(1, 4) + 0.1)
    replies = run_handler(folder / "branchy.mar", [negative.numpy().astype("<f4").tobytes()])
    namespace: dict = {}
    exec(compile(BRANCHY, "branchy.py", "exec"), namespace)
    model = namespace["Branchy"]()
    model.load_state_dict(torch.load(folder / "branchy.pt"))
    expected = model(negative)[0].tolist()
    assert replies[0].status == 200
    assert replies[0].json()["output"] == pytest.approx(expected, rel=1e-5)
