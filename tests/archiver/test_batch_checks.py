"""What the server does to a batched model, checked at packing: it concatenates requests along
the first dimension and splits every output along it. A model whose outputs have no batch
dimension, whose trace fixed the batch size, or whose answer for a row depends on the rows beside
it is refused with one line naming the cause (for the tensor handler, a nested output too); a
reference with infinite outputs of its own packs.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from torchbay.archiver.errors import ConversionError, ParityError
from torchbay.archiver.manifest import read_manifest
from torchbay.archiver.package import package

from .conftest import run_torchbay, tensor_options

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
        if KIND == "nested":
            return y, (y * 2, y * 3)
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


@pytest.mark.parametrize(
    ("kind", "convert", "words"),
    [
        ("scalar", "none", "output 'output1' has shape [] on a batch of 4"),
        ("scalar", "export", "output 'output1' has shape [] on a batch of 4"),
        ("table", "torchscript-trace", "output 'output1' has shape [5] on a batch of 4"),
        ("table", "export", "output 'output1' has shape [5] on a batch of 4"),
        ("loop", "torchscript-trace", "output 'output0' has shape [4, 3] on a batch of 5"),
    ],
)
def test_an_output_without_one_row_per_input_row_is_refused(
    tmp_path: Path, kind: str, convert: str, words: str
) -> None:
    folder = _folder(tmp_path, kind)
    options = tensor_options(kind, folder, "net.py", "net.pt", "x.pt", convert=convert)
    with pytest.raises(ConversionError, match="one row per input row") as caught:
        package(options)
    assert words in str(caught.value)
    assert not (folder / f"{kind}.mar").exists()


def test_a_reference_failing_on_another_batch_size_is_one_line(tmp_path: Path) -> None:
    """A TorchScript file that fixed the batch size fails on one row: one line, no traceback."""

    class Fixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(4, 4) * 2

    torch.jit.save(torch.jit.script(Fixed()), str(tmp_path / "fixed.pt"))
    torch.save(torch.randn(4, 4), tmp_path / "x.pt")
    args = ["archive", "--model-name", "fixed", "--version", "1", "--handler", "tensor"]
    result = run_torchbay(
        *args, "--serialized-file", "fixed.pt", "--example-input", "x.pt", cwd=tmp_path
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    error = [line for line in result.stderr.splitlines() if "error" in line]
    assert error == [
        "torchbay: error: the model fails on a batch of 1: RuntimeError: shape '[4, 4]' is "
        "invalid for input of size 4"
    ]


def test_an_exported_program_of_a_fixed_batch_size(tmp_path: Path) -> None:
    """torch.export without dynamic shapes fixes the batch size: refused in one line, unless
    model-config.yaml declares its inputs whole (no batch dimension): it is then checked and
    served with that shape only."""
    model = torch.nn.Linear(4, 3).eval()
    program = torch.export.export(model, (torch.randn(4, 4),))
    torch.export.save(program, str(tmp_path / "fixed.pt2"))
    torch.save(torch.randn(4, 4), tmp_path / "x.pt")
    args = ["archive", "--model-name", "fixed", "--version", "1", "--handler", "tensor"]
    args += ["--serialized-file", "fixed.pt2", "--example-input", "x.pt"]
    result = run_torchbay(*args, cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "torchbay: error: the model fails on a batch of 1: " in result.stderr
    (tmp_path / "whole.yaml").write_text("inputs:\n  - {name: x, datatype: FP32, shape: [4, 4]}\n")
    result = run_torchbay(*args, "--config-file", "whole.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert read_manifest(tmp_path / "fixed.mar").torchbay.parity.passed


@pytest.mark.parametrize("convert", ["none", "export"])
def test_a_nested_output_is_refused_for_the_tensor_handler(tmp_path: Path, convert: str) -> None:
    folder = _folder(tmp_path, "nested")
    options = tensor_options("nested", folder, "net.py", "net.pt", "x.pt", convert=convert)
    with pytest.raises(ConversionError, match="output 'output1' is a tuple, not a tensor"):
        package(options)
    custom = options.model_copy(update={"handler": "image_classifier"})  # its own outputs
    assert read_manifest(package(custom)).torchbay.parity.passed


def test_a_model_declared_unbatched_may_return_a_scalar(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "scalar")
    (folder / "model-config.yaml").write_text(
        "inputs:\n  - {name: x, datatype: FP32, shape: [4, 4]}\n"
    )
    options = tensor_options(
        "scalar", folder, "net.py", "net.pt", "x.pt", config_file=folder / "model-config.yaml"
    )
    assert read_manifest(package(options)).torchbay.parity.passed


def test_a_torchscript_saved_in_training_mode_is_refused(tmp_path: Path) -> None:
    """BatchNorm traced in training mode normalizes with the batch's statistics: each request's
    answer would depend on the requests batched with it. The CLI says so in one line."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).train()
    with warnings.catch_warnings():  # the tracer's warnings (errors under pytest's filters)
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, torch.randn(4, 4))
    torch.jit.save(traced, str(tmp_path / "bn.pt"))
    torch.save(torch.randn(4, 4), tmp_path / "x.pt")
    args = ["archive", "--model-name", "bn", "--version", "1", "--handler", "tensor"]
    args += ["--serialized-file", "bn.pt", "--example-input", "x.pt"]
    result = run_torchbay(*args, cwd=tmp_path)
    assert result.returncode == 1, result.stdout
    assert "answers a row differently alone than in a batch" in result.stderr
    assert "eval mode" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "bn.mar").exists()


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
