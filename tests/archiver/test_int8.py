"""int8-dynamic without torch.ao.quantization: plain int8 tensors, no deprecation, parity kept."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch

from torchbay.archiver.manifest import read_manifest
from torchbay.handlers.runtime.int8 import Int8DynamicLinear, quantize_linear

from .conftest import run_torchbay

MODEL = """\
import torch


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )

    def forward(self, x):
        return self.net(x)
"""


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).eval()


def test_quantize_linear_uses_plain_int8_and_warns_nothing() -> None:
    model = _mlp().requires_grad_(False)
    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q = quantize_linear(copy.deepcopy(model)).eval()
        out = q(x)
    assert [str(w.message) for w in caught] == []
    assert isinstance(q[0], Int8DynamicLinear) and isinstance(q[2], Int8DynamicLinear)
    dtypes = {k: v.dtype for k, v in q.state_dict().items()}
    assert dtypes["0.weight"] == torch.int8 and dtypes["0.weight_scale"] == torch.float32
    assert not any(d.is_quantized for d in q.state_dict().values())
    ref = model(x)
    assert float((out - ref).abs().max() / ref.abs().max()) < 0.05
    assert torch.equal(torch.jit.script(q)(x), out)  # TorchScript takes it as it is
    # Leading dimensions are kept, as nn.Linear keeps them.
    assert q(torch.randn(2, 3, 16)).shape == (2, 3, 4)


@pytest.mark.slow
@pytest.mark.parametrize("convert", ["export", "torchscript-trace", "none"])
def test_archive_and_verify_int8_print_no_deprecation(tmp_path: Path, convert: str) -> None:
    (tmp_path / "mlp.py").write_text(MODEL)
    model = _mlp()
    holder = torch.nn.Module()
    holder.net = model
    torch.save(holder.state_dict(), tmp_path / "mlp.pt")
    torch.save(torch.randn(6, 16), tmp_path / "example.pt")
    proc = run_torchbay(
        "archive",
        "--model-name",
        "mlp",
        "--version",
        "1.0",
        "--model-file",
        str(tmp_path / "mlp.py"),
        "--serialized-file",
        str(tmp_path / "mlp.pt"),
        "--handler",
        "tensor",
        "--example-input",
        str(tmp_path / "example.pt"),
        "--convert",
        convert,
        "--precision",
        "int8-dynamic",
        "--export-path",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "deprecat" not in (proc.stdout + proc.stderr).lower()
    parity = read_manifest(tmp_path / "mlp.mar").torchbay.parity
    assert parity is not None and parity.passed and parity.top1_agreement == 1.0
    proc = run_torchbay("verify", str(tmp_path / "mlp.mar"))
    assert proc.returncode == 0, proc.stderr
    assert "verify: OK" in proc.stdout
    # torch 2.13 prints "quantized tensor creation functions ... are deprecated" when a model
    # with qint8 tensors loads; the plain-int8 recipe has none.
    assert "deprecat" not in proc.stderr.lower()


def test_an_eager_int8_archive_of_the_torch_ao_recipe_still_loads(tmp_path: Path) -> None:
    """Eager int8 archives packed before the plain-int8 recipe hold torch.ao's packed weights."""
    import json

    from torchbay.handlers.testing import run_handler

    (tmp_path / "mlp.py").write_text(MODEL)
    holder = torch.nn.Module()
    holder.net = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        legacy = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(holder), {torch.nn.Linear}, dtype=torch.qint8
        )
    state = legacy.state_dict()
    assert any("_packed_params" in key for key in state)
    torch.save(state, tmp_path / "q.pt")
    manifest = {
        "model": {
            "modelName": "mlp",
            "serializedFile": "q.pt",
            "modelFile": "mlp.py",
            "handler": "tensor",
        },
        "torchbay": {"format": "eager", "precision": "int8-dynamic"},
    }
    (tmp_path / "MAR-INF").mkdir()
    (tmp_path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    x = torch.randn(1, 16)
    reply = run_handler("tensor", [x.tolist()], model_dir=tmp_path)[0]
    assert reply.status == 200, reply.text
    got = torch.tensor(reply.json()["output"])
    assert torch.allclose(got, legacy.net(x), atol=1e-5)
