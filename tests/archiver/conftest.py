"""Shared fixtures: one digits model trained per session, archive helpers."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchbay.archiver.package import ArchiveOptions

REPO = Path(__file__).resolve().parents[2]


def _load_train_module():
    spec = importlib.util.spec_from_file_location(
        "_digits_train", REPO / "examples" / "digits" / "train.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained digits model folder (model.py, digits.pt, example_input.pt, sample_*.png...)."""
    out = tmp_path_factory.mktemp("digits")
    accuracy = _load_train_module().train(out, epochs=15)
    assert accuracy > 0.9
    return out


@pytest.fixture
def digits_options(digits: Path, tmp_path: Path) -> dict:
    """ArchiveOptions fields for the digits model with the image_classifier handler."""
    return {
        "model_name": "digits",
        "version": "1.0",
        "handler": "image_classifier",
        "serialized_file": digits / "digits.pt",
        "model_file": digits / "model.py",
        "extra_files": str(digits / "index_to_name.json"),
        "config_file": digits / "model-config.yaml",
        "example_input": digits / "example_input.pt",
        "export_path": tmp_path,
    }


def tensor_options(
    name: str, folder: Path, model_file: str, state_dict: str, example: str, **fields: Any
) -> ArchiveOptions:
    """ArchiveOptions for an eager model (``model_file`` and its ``state_dict``) with an
    ``example`` input, all in ``folder``, served by the tensor handler: version 1.0, archived
    into ``folder`` unless ``fields`` (convert, export_path...) say otherwise."""
    fields.setdefault("export_path", folder)
    return ArchiveOptions(
        model_name=name,
        version="1.0",
        handler="tensor",
        model_file=folder / model_file,
        serialized_file=folder / state_dict,
        example_input=folder / example,
        **fields,
    )


def run_torchbay(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m torchbay ARGS`` in a subprocess (what a user runs)."""
    return subprocess.run(
        [sys.executable, "-m", "torchbay", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


CONV_MODEL_SOURCE = (
    "import torch\n"
    "class ConvNet(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.conv = torch.nn.Conv2d(1, 2, 3)\n"
    "    def forward(self, x):\n"
    "        return self.conv(x).mean((2, 3))\n"
)


def write_conv_model(folder: Path) -> tuple[Path, Path]:
    """A model with no Linear/LSTM layer (so int8-dynamic cannot take it): its model file and
    state dict, written into ``folder``."""
    import torch

    model_file = folder / "convnet.py"
    model_file.write_text(CONV_MODEL_SOURCE)
    torch.manual_seed(0)
    holder = torch.nn.Module()
    holder.conv = torch.nn.Conv2d(1, 2, 3)
    state = folder / "conv.pt"
    torch.save(holder.state_dict(), state)
    return model_file, state
