from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from torchbay.handlers.errors import HandlerLoadError
from torchbay.handlers.runtime.loading import (
    load_model,
    model_format,
    model_input_dtype,
    quantize_dynamic,
    read_manifest,
)
from torchbay.handlers.runtime.service import load_service

from .conftest import EAGER_SOURCE, TinyLinear, body_json, req, write_manifest

X = torch.tensor([[1.0, -2.0, 3.0, 0.5]])


def run(model_dir: Path) -> list[float]:
    outcome = load_service(model_dir).predict([req(json.dumps(X[0].tolist()), "application/json")])
    assert outcome.responses[0].status == 200, outcome.responses[0].body
    return body_json(outcome.responses[0])["output"]


def eager_state(tmp_path: Path, precision: str = "fp32") -> dict[str, torch.Tensor]:
    (tmp_path / "model.py").write_text(EAGER_SOURCE)
    torch.manual_seed(1)
    module = torch.nn.Linear(4, 3)
    state = {"fc.weight": module.weight.detach(), "fc.bias": module.bias.detach()}
    return state


def test_torchscript(tmp_path: Path, tiny_model: TinyLinear) -> None:
    torch.jit.trace(tiny_model, X).save(str(tmp_path / "m.pt"))
    write_manifest(tmp_path, serialized="m.pt", handler="tensor", torchbay={})
    assert run(tmp_path) == pytest.approx(tiny_model(X)[0].tolist(), rel=1e-5)


@pytest.mark.parametrize("with_torchbay", [True, False])
def test_exported(tmp_path: Path, tiny_model: TinyLinear, with_torchbay: bool) -> None:
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(tiny_model, (X.repeat(2, 1),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "m.pt2"))
    write_manifest(
        tmp_path,
        serialized="m.pt2",
        handler="tensor",
        torchbay={"format": "exported"} if with_torchbay else None,
    )
    assert model_format(read_manifest(tmp_path)) == "exported"
    assert run(tmp_path) == pytest.approx(tiny_model(X)[0].tolist(), rel=1e-5)


def test_eager_torchserve_style(tmp_path: Path) -> None:
    state = eager_state(tmp_path)
    torch.save(state, tmp_path / "weights.pth")
    write_manifest(tmp_path, serialized="weights.pth", handler="tensor", model_file="model.py")
    manifest = read_manifest(tmp_path)
    assert model_format(manifest) == "eager"
    want = (X @ state["fc.weight"].T + state["fc.bias"])[0].tolist()
    assert run(tmp_path) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize(
    ("precision", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)]
)
def test_eager_half_keeps_stored_dtype(tmp_path: Path, precision: str, dtype: torch.dtype) -> None:
    state = {k: v.to(dtype) for k, v in eager_state(tmp_path).items()}
    torch.save(state, tmp_path / "w.pt")
    write_manifest(
        tmp_path,
        serialized="w.pt",
        handler="tensor",
        model_file="model.py",
        torchbay={"format": "eager", "precision": precision},
    )
    manifest = read_manifest(tmp_path)
    model = load_model(tmp_path, manifest, "cpu")
    assert model.fc.weight.dtype == dtype and not model.training
    assert model_input_dtype(model, manifest) == dtype
    assert model_input_dtype(model) == dtype  # from the parameters when no manifest
    want = (X @ state["fc.weight"].float().T + state["fc.bias"].float())[0].tolist()
    assert run(tmp_path) == pytest.approx(want, rel=0.05, abs=0.05)


def test_eager_int8_dynamic(tmp_path: Path) -> None:
    eager_state(tmp_path)
    from importlib import util

    spec = util.spec_from_file_location("tiny_eager_src", tmp_path / "model.py")
    source = util.module_from_spec(spec)
    spec.loader.exec_module(source)
    float_model = source.Tiny().eval()
    quantized = quantize_dynamic(copy.deepcopy(float_model))
    torch.save(quantized.state_dict(), tmp_path / "q.pt")
    write_manifest(
        tmp_path,
        serialized="q.pt",
        handler="tensor",
        model_file="model.py",
        torchbay={"format": "eager", "precision": "int8-dynamic"},
    )
    assert run(tmp_path) == pytest.approx(float_model(X)[0].tolist(), abs=0.05)


def test_missing_serialized_file(tmp_path: Path) -> None:
    write_manifest(tmp_path, serialized="gone.pt", handler="tensor")
    with pytest.raises(HandlerLoadError, match=r"gone\.pt"):
        load_service(tmp_path)


def test_corrupt_serialized_file(tmp_path: Path) -> None:
    (tmp_path / "bad.pt").write_bytes(b"not a model")
    write_manifest(tmp_path, serialized="bad.pt", handler="tensor")
    with pytest.raises(HandlerLoadError, match=r"bad\.pt"):
        load_service(tmp_path)


def test_eager_model_file_with_two_classes(tmp_path: Path) -> None:
    eager_state(tmp_path)
    (tmp_path / "model.py").write_text(
        EAGER_SOURCE + "\n\nclass Other(torch.nn.Module):\n    pass\n"
    )
    torch.save({}, tmp_path / "w.pt")
    write_manifest(tmp_path, serialized="w.pt", handler="tensor", model_file="model.py")
    with pytest.raises(HandlerLoadError, match=r"exactly one nn\.Module"):
        load_service(tmp_path)


def test_a_handler_only_archive_has_no_model(tmp_path: Path) -> None:
    """The archiver records a format ("eager") for an archive without a serialized file too (a
    handler that computes alone, such as examples/triton's bytes_handler.py): BaseHandler gets
    no model, not a KeyError."""
    write_manifest(tmp_path, serialized=None, handler="tensor", torchbay={"format": "eager"})
    assert load_model(tmp_path, read_manifest(tmp_path), "cpu") is None
