"""Fixtures: tiny models written to a model directory with a hand-written MANIFEST.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tiny_sources import TINY_LINEAR_SOURCE
from torchbay.handlers.runtime.service import Request


class TinyLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        torch.manual_seed(0)
        with torch.no_grad():
            self.fc.weight.copy_(torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10)
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


EAGER_SOURCE = TINY_LINEAR_SOURCE  # the module of TinyLinear's eager archive


def write_manifest(
    model_dir: Path,
    *,
    serialized: str | None,
    handler: str,
    model_file: str | None = None,
    torchbay: dict[str, Any] | None = None,
    config_file: str | None = None,
    name: str = "tiny",
) -> None:
    model: dict[str, Any] = {"modelName": name, "modelVersion": "1.0", "handler": handler}
    if serialized:
        model["serializedFile"] = serialized
    if model_file:
        model["modelFile"] = model_file
    if config_file:
        model["configFile"] = config_file
    manifest: dict[str, Any] = {
        "createdOn": "01/01/2025 00:00:00",
        "runtime": "python",
        "model": model,
        "archiverVersion": "test",
    }
    if torchbay is not None:
        manifest["torchbay"] = {
            "format": "torchscript",
            "precision": "fp32",
            "files": {},
            "parity": None,
            "example_input": None,
            "input_shape": None,
            "input_dtype": "float32",
            "archiver_version": "test",
            **torchbay,
        }
    (model_dir / "MAR-INF").mkdir(parents=True, exist_ok=True)
    (model_dir / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))


@pytest.fixture
def tiny_model() -> TinyLinear:
    return TinyLinear().eval()


@pytest.fixture
def torchscript_dir(tmp_path: Path, tiny_model: TinyLinear) -> Callable[..., Path]:
    """A model dir with the tiny model as TorchScript; kwargs go to write_manifest."""

    def make(handler: str = "tensor", **kwargs: Any) -> Path:
        model_dir = tmp_path / "model"
        model_dir.mkdir(exist_ok=True)
        torch.jit.script(tiny_model).save(str(model_dir / "model.pt"))
        write_manifest(model_dir, serialized="model.pt", handler=handler, **kwargs)
        return model_dir

    return make


def req(body: bytes | str = b"", content_type: str = "", rid: str = "r", **kw: Any) -> Request:
    if isinstance(body, str):
        body = body.encode()
    return Request(request_id=rid, body=body, content_type=content_type, **kw)


def body_json(response: Any) -> Any:
    return json.loads(response.body)
