"""The signature ``torchbay archive`` records from the example input and a run of the packed
model: single and multi-input models, tuple and dict examples, tuple/dict outputs, exported
dynamic dimensions, the parity check over several inputs, and the legacy input fields."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.tiny_sources import saved_model
from torchbay.archiver.errors import ArchiveArgumentError
from torchbay.archiver.extract import extract_archive
from torchbay.archiver.manifest import read_manifest
from torchbay.archiver.package import ArchiveOptions, package
from torchbay.archiver.signature import TensorSpec, model_signature

from .conftest import run_torchbay

MODEL_FILE = """
import torch
from torch import nn


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(2, 3)

    def forward(self, features, extra):
        y = self.a(features) + self.b(extra)
        return y, y.sum(dim=1)
"""


@pytest.fixture
def two_inputs(tmp_path: Path) -> dict:
    """An eager two-input model (model file + state dict) returning a tuple."""
    saved_model(tmp_path, "two_inputs_model.py", MODEL_FILE, "TwoInputs", "state.pt")
    return {
        "model_name": "two",
        "version": "1.0",
        "handler": "tensor",
        "serialized_file": tmp_path / "state.pt",
        "model_file": tmp_path / "two_inputs_model.py",
        "export_path": tmp_path / "out",
    }


def _spec(name: str, shape: list[int], datatype: str = "FP32") -> TensorSpec:
    return TensorSpec(name=name, datatype=datatype, shape=shape)


def test_a_dict_example_names_the_inputs_in_forward_order(two_inputs: dict, tmp_path) -> None:
    # Keys in the "wrong" order: forward's parameter order wins.
    example = {"extra": torch.randn(5, 2), "features": torch.randn(5, 4)}
    torch.save(example, tmp_path / "ex.pt")
    for convert in ("torchscript-trace", "export", "none"):
        out = package(
            ArchiveOptions(**two_inputs, convert=convert, example_input=tmp_path / "ex.pt",
                           force=True)
        )  # fmt: skip
        tb = read_manifest(out).torchbay
        assert tb is not None and tb.parity is not None and tb.parity.passed, convert
        assert tb.inputs == [_spec("features", [-1, 4]), _spec("extra", [-1, 2])], convert
        assert tb.outputs == [_spec("output0", [-1, 3]), _spec("output1", [-1])], convert
        # No single legacy input for a multi-input model; the example keeps every input.
        assert tb.input_shape is None and tb.example_input == "example_input.npz"
        dest = tmp_path / f"x-{convert}"
        extract_archive(out, dest)
        with np.load(dest / "example_input.npz") as npz:
            assert sorted(npz.files) == ["extra", "features"]


def test_a_tuple_example_is_input0_input1(two_inputs: dict, tmp_path) -> None:
    torch.save((torch.randn(3, 4), torch.randn(3, 2)), tmp_path / "ex.pt")
    out = package(ArchiveOptions(**two_inputs, example_input=tmp_path / "ex.pt"))
    tb = read_manifest(out).torchbay
    assert tb is not None
    assert [s.name for s in tb.inputs or []] == ["input0", "input1"]
    assert model_signature(tb.model_dump(), None).to_json()["outputs"] == [
        {"name": "output0", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "output1", "datatype": "FP32", "shape": [-1]},
    ]


def test_examples_with_different_batch_sizes_are_refused(two_inputs: dict, tmp_path) -> None:
    torch.save((torch.randn(3, 4), torch.randn(2, 2)), tmp_path / "ex.pt")
    with pytest.raises(ArchiveArgumentError, match="same batch size"):
        package(ArchiveOptions(**two_inputs, example_input=tmp_path / "ex.pt"))
    torch.save([torch.randn(3, 4), "text"], tmp_path / "bad.pt")
    with pytest.raises(ArchiveArgumentError, match="input1 must be a tensor"):
        package(ArchiveOptions(**two_inputs, example_input=tmp_path / "bad.pt"))


class _DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.fc(x)
        return {"logits": y, "ids": y.argmax(dim=1)}


def test_single_input_dict_output_and_legacy_fields(tmp_path: Path) -> None:
    torch.jit.save(torch.jit.script(_DictOut().eval()), str(tmp_path / "m.pt"))
    torch.save(torch.randn(2, 6), tmp_path / "ex.pt")
    out = package(
        ArchiveOptions(model_name="d", version="1", handler="tensor",
                       serialized_file=tmp_path / "m.pt", example_input=tmp_path / "ex.pt",
                       export_path=tmp_path)
    )  # fmt: skip
    tb = read_manifest(out).torchbay
    assert tb is not None
    assert tb.inputs == [_spec("input0", [-1, 6])]
    assert tb.outputs == [_spec("logits", [-1, 4]), _spec("ids", [-1], "INT64")]
    assert (tb.example_input, tb.input_shape, tb.input_dtype) == (
        "example_input.npy",
        [6],
        "float32",
    )


def test_archive_help_documents_the_example_input() -> None:
    result = run_torchbay("archive", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "a dict of tensors" in text and "input0, input1" in text and "signature" in text


def test_inspect_shows_the_signature(two_inputs: dict, tmp_path) -> None:
    torch.save({"features": torch.randn(2, 4), "extra": torch.randn(2, 2)}, tmp_path / "ex.pt")
    out = package(ArchiveOptions(**two_inputs, example_input=tmp_path / "ex.pt"))
    result = run_torchbay("inspect", str(out))
    assert result.returncode == 0, result.stderr
    assert "inputs:     features FP32 [-1, 4], extra FP32 [-1, 2]" in result.stdout
    assert "outputs:    output0 FP32 [-1, 3], output1 FP32 [-1]" in result.stdout
    assert "example_input.npz (one array per input, by name)" in result.stdout
    verify = run_torchbay("verify", str(out))  # the stored example, as an OIP request
    assert verify.returncode == 0, verify.stderr
    assert "example_input.npz[0] (features, extra) as an OIP request" in verify.stdout


class _Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(tokens)


def test_an_exported_program_records_its_own_dynamic_dimensions(tmp_path: Path) -> None:
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=32)
    program = torch.export.export(
        _Seq().eval(), (torch.randn(2, 5, 4),), dynamic_shapes=({0: batch, 1: seq},)
    )
    torch.export.save(program, str(tmp_path / "seq.pt2"))
    torch.save(torch.randn(3, 7, 4), tmp_path / "ex.pt")
    out = package(
        ArchiveOptions(model_name="seq", version="1", handler="tensor",
                       serialized_file=tmp_path / "seq.pt2", example_input=tmp_path / "ex.pt",
                       export_path=tmp_path)
    )  # fmt: skip
    m = read_manifest(out)
    assert m.model.serialized_file == "seq.pt2" and m.torchbay is not None
    assert m.torchbay.format == "exported" and m.torchbay.parity.passed
    assert m.torchbay.inputs == [_spec("input0", [-1, -1, 4])]
    assert m.torchbay.outputs == [_spec("output0", [-1, -1, 2])]


MIXED_FILE = """
import torch
from torch import nn


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)

    def forward(self, features, ids):
        return self.a(features) + ids.unsqueeze(1).to(features.dtype), ids * 2
"""


@pytest.mark.parametrize(
    ("convert", "precision", "half"),
    [("none", "fp16", "FP16"), ("export", "bf16", "BF16"), ("none", "int8-dynamic", "FP32")],
)
def test_a_half_precision_archive_declares_its_floating_tensors_half(
    tmp_path: Path, convert: str, precision: str, half: str
) -> None:
    """Issue 28: floating inputs and outputs in the model's own dtype (integer ones keep theirs;
    int8-dynamic computes in float32), the parity still measured against the fp32 model."""
    (tmp_path / "mixed.py").write_text(MIXED_FILE)
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(MIXED_FILE, "mixed.py", "exec"), namespace)
    torch.save(namespace["Mixed"]().state_dict(), tmp_path / "mixed.pt")
    torch.save({"features": torch.randn(2, 4), "ids": torch.tensor([1, 2])}, tmp_path / "ex.pt")
    out = package(
        ArchiveOptions(
            model_name="m",
            version="1",
            handler="tensor",
            convert=convert,
            precision=precision,
            model_file=tmp_path / "mixed.py",
            serialized_file=tmp_path / "mixed.pt",
            example_input=tmp_path / "ex.pt",
            export_path=tmp_path,
        )
    )
    tb = read_manifest(out).torchbay
    assert tb is not None and tb.precision == precision
    assert tb.inputs == [_spec("features", [-1, 4], half), _spec("ids", [-1], "INT64")]
    assert tb.outputs == [_spec("output0", [-1, 3], half), _spec("output1", [-1], "INT64")]
    assert tb.parity is not None and tb.parity.passed and tb.parity.max_rel_error > 0
    assert tb.parity.tolerance.max_rel_error >= 5e-2  # the precision's, not fp32's 1e-4


def test_an_example_saved_with_autograd_packs(two_inputs: dict, tmp_path: Path) -> None:
    """An example computed with autograd on (requires_grad): a RuntimeError traceback ('Can't
    call numpy() on Tensor that requires grad') when the archiver saved it."""
    features = torch.randn(3, 4, requires_grad=True) * 1.0
    torch.save((features, torch.randn(3, 2)), tmp_path / "ex.pt")
    out = package(ArchiveOptions(**two_inputs, example_input=tmp_path / "ex.pt"))
    assert read_manifest(out).torchbay.inputs[0].shape == [-1, 4]


def test_a_sparse_example_is_refused_in_one_line(two_inputs: dict, tmp_path: Path) -> None:
    """A sparse example tensor was a RuntimeError traceback ('unsupported memory format')."""
    torch.save((torch.randn(3, 4).to_sparse(), torch.randn(3, 2)), tmp_path / "ex.pt")
    with pytest.raises(ArchiveArgumentError, match="input0 must be a dense tensor, got a sparse"):
        package(ArchiveOptions(**two_inputs, example_input=tmp_path / "ex.pt"))


@pytest.mark.parametrize("keys", [(0, 1), ("", "extra")])
def test_a_dict_example_whose_keys_are_no_names_is_refused(
    two_inputs: dict, tmp_path: Path, keys: tuple
) -> None:
    """Integer keys were a KeyError traceback ('0'); an empty one 'invalid configuration:
    name: String should have at least 1 character'."""
    example = dict(zip(keys, (torch.randn(3, 4), torch.randn(3, 2)), strict=True))
    torch.save(example, tmp_path / "ex.pt")
    with pytest.raises(ArchiveArgumentError, match="keys name the inputs and must be non-empty"):
        package(ArchiveOptions(**two_inputs, example_input=tmp_path / "ex.pt"))
