"""An archive made by TorchServe's own torch-model-archiver loads and serves unchanged."""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tests.torchserve_archivers import run_archiver
from torchbay.handlers.runtime.service import load_service

from .conftest import TinyLinear, body_json, req

HANDLER = """
import json

import torch
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import map_class_to_label


class LinearHandler(BaseHandler):
    def preprocess(self, data):
        rows = [row.get("data") or row.get("body") for row in data]
        rows = [json.loads(r) if isinstance(r, (bytes, bytearray, str)) else r for r in rows]
        return torch.tensor(rows, dtype=torch.float32)

    def postprocess(self, data):
        return map_class_to_label(torch.softmax(data, 1).tolist(), self.mapping)
"""


def archiver() -> str | None:
    return shutil.which("torch-model-archiver", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(archiver() is None, reason="torch-model-archiver (dev extra) not installed")
def test_torch_model_archiver_mar(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    torch.jit.script(TinyLinear().eval()).save(str(src / "model.pt"))
    (src / "handler.py").write_text(HANDLER)
    (src / "index_to_name.json").write_text(json.dumps({"0": "a", "1": "b", "2": "c"}))
    export = tmp_path / "store"
    export.mkdir()
    run_archiver(
        [
            archiver(),
            "--model-name", "lin", "--version", "2.0",
            "--serialized-file", str(src / "model.pt"),
            "--handler", str(src / "handler.py"),
            "--extra-files", str(src / "index_to_name.json"),
            "--export-path", str(export),
        ],
        timeout=120,
    )  # fmt: skip
    model_dir = tmp_path / "unpacked"
    with zipfile.ZipFile(export / "lin.mar") as archive:
        archive.extractall(model_dir)
    service = load_service(model_dir)
    assert (service.model_name, service.model_version) == ("lin", "2.0")
    outcome = service.predict([req("[1, 2, 3, 4]", "application/json")])
    assert outcome.responses[0].status == 200, outcome.responses[0].body
    probs = body_json(outcome.responses[0])
    assert set(probs) == {"a", "b", "c"} and max(probs, key=probs.get) == "c"


@pytest.mark.skipif(archiver() is None, reason="torch-model-archiver (dev extra) not installed")
def test_torchserves_base_handler_by_name(tmp_path: Path) -> None:
    """torch-model-archiver --handler base_handler (TorchServe loads its BaseHandler by that
    name): the worker refused it ('unknown handler base_handler') and torchbay archive too."""
    from torchbay.cli import main
    from torchbay.handlers.base_handler import BaseHandler

    torch.jit.script(TinyLinear().eval()).save(str(tmp_path / "model.pt"))
    files = ["--serialized-file", str(tmp_path / "model.pt"), "--export-path", str(tmp_path)]
    for name, command in (("b", [str(archiver())]), ("ours", [])):
        flags = ["--model-name", name, "--version", "1", "--handler", "base_handler", *files]
        if command:  # torch-model-archiver's, then the same flags to torchbay archive
            run_archiver([*command, *flags], timeout=120)
        else:
            assert main(["archive", *flags]) == 0
    for mar in (tmp_path / "b.mar", tmp_path / "ours.mar"):
        model_dir = tmp_path / mar.stem
        with zipfile.ZipFile(mar) as archive:
            archive.extractall(model_dir)
        service = load_service(model_dir)
        assert type(service.handler) is BaseHandler
        assert isinstance(service.handler.model, torch.jit.ScriptModule)
