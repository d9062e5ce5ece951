"""The worker's own guard: whatever a manifest (or a handler spec) says, only files inside the
model folder are loaded or imported; built-in names and module paths still resolve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from torchbay.handlers.errors import HandlerLoadError
from torchbay.handlers.runtime.loading import load_model
from torchbay.handlers.runtime.resolve import resolve_handler
from torchbay.handlers.runtime.service import load_service

EVIL = "import pathlib\npathlib.Path(__file__).with_name('imported').write_text('1')\n"


def _model_dir(tmp_path: Path, **model: Any) -> Path:
    """``tmp_path/outside`` holds files a hostile manifest points at; ``tmp_path/m`` the model."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "evil.py").write_text(EVIL)
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(outside / "model.pt"))
    (outside / "config.yaml").write_text("batchSize: 4\n")
    root = tmp_path / "m"
    (root / "MAR-INF").mkdir(parents=True, exist_ok=True)
    torch.save(torch.nn.Linear(2, 2).state_dict(), str(root / "model.pt"))
    fields = {"modelName": "m", "modelVersion": "1.0", "handler": "tensor", **model}
    (root / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"model": fields}))
    return root


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("serializedFile", "../outside/model.pt"),
        ("serializedFile", "ABS/outside/model.pt"),
        ("modelFile", "../outside/evil.py"),
    ],
)
def test_load_model_refuses_files_outside_the_model_dir(tmp_path, field, value) -> None:
    value = value.replace("ABS", str(tmp_path))
    model = {"serializedFile": "model.pt", field: value}
    root = _model_dir(tmp_path, **model)
    manifest = json.loads((root / "MAR-INF" / "MANIFEST.json").read_text())
    with pytest.raises(HandlerLoadError, match=field):
        load_model(root, manifest, "cpu")
    assert not (tmp_path / "outside" / "imported").exists()


@pytest.mark.parametrize("spec", ["../outside/evil.py", "../outside/evil", "ABS/evil.py:handle"])
def test_handler_files_outside_the_model_dir_are_never_imported(tmp_path, spec) -> None:
    root = _model_dir(tmp_path)
    spec = spec.replace("ABS", str(tmp_path / "outside"))
    with pytest.raises(HandlerLoadError, match="inside the archive"):
        resolve_handler(spec, root)
    assert not (tmp_path / "outside" / "imported").exists()


def test_config_file_outside_the_model_dir_is_refused(tmp_path) -> None:
    root = _model_dir(tmp_path, configFile="../outside/config.yaml")
    with pytest.raises(HandlerLoadError, match="configFile"):
        load_service(root)


def test_builtin_module_and_local_file_handlers_still_resolve(tmp_path) -> None:
    root = _model_dir(tmp_path)
    (root / "my_handler.py").write_text("def handle(data, context):\n    return data\n")
    assert resolve_handler("my_handler.py:handle", root).is_function
    assert resolve_handler("my_handler", root).is_function
    assert not resolve_handler("image_classifier", root).is_function
    assert not resolve_handler("torchbay.handlers.tensor", root).is_function
