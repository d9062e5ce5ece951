"""model-config.yaml's ``pt2`` (handlers/runtime/pt2.py), as TorchServe 0.12's BaseHandler reads
it: ``compile: {enable, backend, mode, ...}``, ``export`` (nothing compiled), the deprecated string
and mapping forms; an unknown backend or a failing compile leaves the model as it was. Compiled
with the ``eager`` backend here: the same dynamo path, no C++ toolchain, seconds not minutes."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from torchbay.handlers.base_handler import BaseHandler
from torchbay.handlers.errors import HandlerLoadError
from torchbay.handlers.runtime import pt2
from torchbay.handlers.testing import run_handler

from .conftest import write_manifest


@pytest.mark.parametrize(
    ("config", "options"),
    [
        (None, None),
        ({}, None),
        ({"pt2": {"compile": {"enable": True}}}, {}),
        (
            {"pt2": {"compile": {"enable": True, "backend": "inductor", "mode": "max-autotune"}}},
            {"backend": "inductor", "mode": "max-autotune"},
        ),
        ({"pt2": {"compile": {"enable": False, "backend": "inductor"}}}, None),
        ({"pt2": {"export": {"aot_compile": True}}}, None),
        ({"pt2": "eager"}, {"backend": "eager"}),  # deprecated, still read
        ({"pt2": {"backend": "eager", "mode": "default"}}, {"backend": "eager", "mode": "default"}),
    ],
)
def test_compile_options_as_torchserve_reads_them(config: Any, options: Any) -> None:
    assert pt2.compile_options(config) == options


def test_a_pt2_that_is_neither_a_string_nor_a_mapping_is_a_load_error() -> None:
    with pytest.raises(HandlerLoadError, match="pt2"):
        pt2.compile_options({"pt2": ["inductor"]})


def test_the_deprecated_forms_say_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="torchbay.handler"):
        pt2.compile_options({"pt2": "eager"})
    assert "deprecated" in caplog.text


def test_compiled_with_the_backend_asked_for() -> None:
    model = torch.nn.Linear(3, 2)
    compiled = pt2.apply(model, {"pt2": {"compile": {"enable": True, "backend": "eager"}}})
    assert compiled is not model and compiled._orig_mod is model
    x = torch.ones(4, 3)
    assert torch.equal(compiled(x), model(x))
    assert pt2.apply(model, {"pt2": {"compile": {"enable": False}}}) is model


def test_an_unknown_backend_or_a_failing_compile_keeps_the_model(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = torch.nn.Linear(3, 2)
    with caplog.at_level(logging.WARNING, logger="torchbay.handler"):
        kept = pt2.apply(model, {"pt2": {"compile": {"enable": True, "backend": "no-such"}}})
    assert kept is model and "'no-such'" in caplog.text

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    with caplog.at_level(logging.WARNING, logger="torchbay.handler"):
        kept = pt2.apply(model, {"pt2": {"compile": {"enable": True, "backend": "eager"}}})
    assert kept is model and "proceeding without" in caplog.text


class Rows(BaseHandler):
    def preprocess(self, data: list[dict]) -> torch.Tensor:
        return torch.tensor([json.loads(row["body"]) for row in data], dtype=torch.float32)


MODEL_PY = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)
"""


def _eager_archive(model_dir: Path) -> None:
    """An eager model (modelFile + state dict), the kind TorchServe's pt2 compile is for."""
    model_dir.mkdir()
    (model_dir / "model.py").write_text(MODEL_PY)
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(3, 2).state_dict(), model_dir / "model.pth")
    state = torch.load(model_dir / "model.pth")
    torch.save({f"fc.{k}": v for k, v in state.items()}, model_dir / "model.pth")
    write_manifest(model_dir, serialized="model.pth", handler="base", model_file="model.py")


BODIES = [json.dumps([1.0, 2.0, 3.0]).encode(), json.dumps([0.5, 0.0, -1.0]).encode()]


def test_the_base_handler_serves_the_compiled_model(tmp_path: Path) -> None:
    """An eager archive whose model-config.yaml asks for pt2 compile: the handler's model is
    compiled, and it answers what the plain model answers."""
    model_dir = tmp_path / "model"
    _eager_archive(model_dir)
    plain = run_handler(Rows(), BODIES, model_dir=model_dir, batch_size=2)
    handler = Rows()
    config = {"pt2": {"compile": {"enable": True, "backend": "eager"}}}
    compiled = run_handler(
        handler, BODIES, model_dir=model_dir, batch_size=2, model_yaml_config=config
    )
    assert [r.status for r in compiled] == [200, 200]
    for got, want in zip(compiled, plain, strict=True):
        assert got.json() == pytest.approx(want.json())
    assert hasattr(handler.model, "_orig_mod")  # torch.compile's wrapper


def test_a_torchscript_model_is_served_uncompiled(tmp_path: Path) -> None:
    """torch.compile refuses TorchScript modules: as TorchServe, the model is served as it is."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    torch.jit.script(torch.nn.Linear(3, 2).eval()).save(str(model_dir / "model.pt"))
    write_manifest(model_dir, serialized="model.pt", handler="base")
    handler = Rows()
    config = {"pt2": {"compile": {"enable": True, "backend": "eager"}}}
    replies = run_handler(handler, BODIES, model_dir=model_dir, model_yaml_config=config)
    assert [r.status for r in replies] == [200, 200]
    assert isinstance(handler.model, torch.jit.ScriptModule)
