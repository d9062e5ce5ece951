"""``torchbay archive --convert aoti``: torch.export + AOTInductor, served by real workers.

One AOTInductor compile takes tens of seconds on a loaded 2-core box, so the tiny model is
compiled ONCE per session (``aoti_archive``) and every test reuses it.
"""

from __future__ import annotations

import asyncio
import io
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.server.conftest import LiveServer, make_config
from torchbay.archiver.errors import ArchiveArgumentError, ConversionError, ParityError
from torchbay.archiver.manifest import Tolerance, read_manifest
from torchbay.archiver.package import ArchiveOptions, package
from torchbay.archiver.parity import check
from torchbay.handlers.errors import HandlerLoadError
from torchbay.handlers.runtime.loading import load_model

from .conftest import tensor_options

# The session's one AOTInductor compile (a C++ build of the model) is charged to whichever test
# asks for ``aoti_archive`` first: ~20 s on a quiet 2-core box, past the default 120 s on one
# running another suite beside this one. A bound on a hang, not on speed.
pytestmark = pytest.mark.timeout(600)

MODEL_PY = """
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))

    def forward(self, x):
        return self.net(x)
"""


def _eager(folder: Path) -> torch.nn.Module:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_aoti_tiny", folder / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.Tiny().eval()
    model.load_state_dict(torch.load(folder / "tiny.pt", weights_only=True))
    return model


@pytest.fixture(scope="session")
def tiny_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("aoti-src")
    (folder / "model.py").write_text(MODEL_PY)
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.net = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)
    )
    torch.save(model.state_dict(), folder / "tiny.pt")
    torch.save(torch.randn(2, 16), folder / "example.pt")
    return folder


def _options(src: Path, export: Path, **extra: Any) -> ArchiveOptions:
    files = ("model.py", "tiny.pt", "example.pt")  # as tiny_src writes them
    return tensor_options("tiny_aoti", src, *files, export_path=export, convert="aoti", **extra)


@pytest.fixture(scope="session")
def aoti_archive(tiny_src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model packed with --convert aoti (compiled once per session) in a model store."""
    store = tmp_path_factory.mktemp("aoti-store")
    return package(_options(tiny_src, store))


def test_manifest_records_aoti_format_parity_and_dynamic_batch(aoti_archive: Path) -> None:
    manifest = read_manifest(aoti_archive)
    tb = manifest.torchbay
    assert tb is not None and tb.format == "aoti" and manifest.model.serialized_file == "model.pt2"
    assert tb.parity is not None and tb.parity.passed and tb.parity.max_rel_error < 1e-4
    assert tb.inputs is not None and tb.inputs[0].shape == [-1, 16]
    with zipfile.ZipFile(aoti_archive) as zf:  # a compiled package, not an exported program
        inner = zipfile.ZipFile(io.BytesIO(zf.read("model.pt2")))
        assert any(n.endswith(".wrapper.so") for n in inner.namelist())


def _extract(archive: Path, dest: Path) -> Path:
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(dest)
    return dest


_AOTI_MANIFEST = {"model": {"serializedFile": "model.pt2"}, "torchbay": {"format": "aoti"}}


def _load_cpu(archive: Path, tmp_path: Path) -> torch.nn.Module:
    """The archive's compiled package, as the CPU worker loads it."""
    return load_model(_extract(archive, tmp_path / "m"), _AOTI_MANIFEST, "cpu")


def test_loader_runs_any_batch_and_chunks_past_the_max(
    aoti_archive: Path, tiny_src: Path, tmp_path: Path
) -> None:
    loaded = _load_cpu(aoti_archive, tmp_path)
    eager = _eager(tiny_src)
    loaded.max_batch = 4  # past it the batch runs in chunks of max_batch rows
    for rows in (1, 3, 9):
        x = torch.randn(rows, 16)
        with torch.inference_mode():
            torch.testing.assert_close(loaded(x), eager(x), rtol=1e-4, atol=1e-5)


def test_cuda_package_refused_on_a_cpu_worker(aoti_archive: Path, tmp_path: Path) -> None:
    folder = _extract(aoti_archive, tmp_path / "m")
    pkg = folder / "model.pt2"
    with zipfile.ZipFile(pkg) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    with zipfile.ZipFile(pkg, "w") as zf:  # the same package, recorded as compiled for CUDA
        for name, data in members.items():
            if name.endswith("wrapper_metadata.json"):
                data = data.replace(b'"AOTI_DEVICE_KEY": "cpu"', b'"AOTI_DEVICE_KEY": "cuda"')
            zf.writestr(name, data)
    with pytest.raises(HandlerLoadError, match=r"compiled for cuda.*runs on cpu"):
        load_model(folder, _AOTI_MANIFEST, "cpu")


def test_parity_check_catches_a_package_that_differs(
    aoti_archive: Path, tiny_src: Path, tmp_path: Path
) -> None:
    """The archiver's check, run on the compiled package against a reference it does not match."""
    loaded = _load_cpu(aoti_archive, tmp_path)
    reference = _eager(tiny_src)
    with torch.no_grad():
        reference.net[2].bias.add_(0.5)
    with pytest.raises(ParityError, match="max_rel_error"):
        check(
            reference,
            loaded,
            [torch.randn(1, 16), torch.randn(4, 16)],
            Tolerance(max_rel_error=1e-4),
            allow_drift=False,
            what="fp32 aoti",
        )


def test_cuda_device_refused_on_a_cpu_host(tiny_src: Path, tmp_path: Path) -> None:
    if torch.cuda.is_available():
        # the refusal under test is a CPU-only host's; a GPU host compiles for CUDA instead
        # (measured by scripts/gpu/bench.py where a GPU is lent)
        pytest.skip("this host has a usable CUDA GPU: the CPU-only refusal does not apply")
    with pytest.raises(ArchiveArgumentError, match="no usable CUDA GPU"):
        package(_options(tiny_src, tmp_path, device="cuda"))
    assert not list(tmp_path.iterdir())


def test_device_without_aoti_refused(tiny_src: Path, tmp_path: Path) -> None:
    options = _options(tiny_src, tmp_path, device="cuda").model_copy(update={"convert": "export"})
    with pytest.raises(ArchiveArgumentError, match=r"--convert aoti only"):
        package(options)


async def _infer_all(url: str, bodies: list[list[list[float]]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(
            *(client.post(f"{url}/predictions/tiny_aoti", json=b) for b in bodies)
        )


@pytest.mark.parametrize("batch_size", [1, 4])
def test_archive_serve_infer_equals_eager(
    aoti_archive: Path, tiny_src: Path, batch_size: int
) -> None:
    models = {
        "tiny_aoti": {
            "1.0": {
                "marName": aoti_archive.name,
                "batchSize": batch_size,
                "maxBatchDelay": 50,
                "defaultVersion": True,
            }
        }
    }
    server = LiveServer(make_config(aoti_archive.parent, models=models)).start()
    try:
        torch.manual_seed(batch_size)
        inputs = [torch.randn(1, 16) for _ in range(8)]
        responses = asyncio.run(_infer_all(server.url, [x.tolist() for x in inputs]))
    finally:
        server.stop()
    eager = _eager(tiny_src)
    for x, response in zip(inputs, responses, strict=True):
        assert response.status_code == 200, response.text
        with torch.inference_mode():
            expected = eager(x)
        torch.testing.assert_close(
            torch.tensor(response.json()["output"]), expected, rtol=1e-4, atol=1e-5
        )


def test_no_compiler_is_a_clear_archiver_error(
    tiny_src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C++ compiler is the I/O seam: point Inductor at one that does not exist."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, str(tmp_path / "no-such-g++")))
    with pytest.raises(ConversionError, match="needs a C\\+\\+ compiler at packing time"):
        package(_options(tiny_src, tmp_path / "out"))
    assert not (tmp_path / "out" / "tiny_aoti.mar").exists()
