"""``package()``: each flag, each conversion and precision, parity, layouts (real torch models)."""

from __future__ import annotations

import json
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

from torchbay.archiver.errors import ArchiveArgumentError, ConversionError, ParityError
from torchbay.archiver.extract import extract_archive
from torchbay.archiver.manifest import read_manifest
from torchbay.archiver.package import ArchiveOptions, package
from torchbay.handlers.runtime.loading import load_model, model_input_dtype
from torchbay.handlers.runtime.loading import read_manifest as read_dict

from .conftest import tensor_options, write_conv_model


def _load_and_run(archive: Path, dest: Path, x: torch.Tensor) -> torch.Tensor:
    """Unpack and load as a worker does, then run ``x``."""
    extract_archive(archive, dest)
    manifest = read_dict(dest)
    model = load_model(dest, manifest, "cpu")
    with torch.inference_mode():
        return model(x.to(model_input_dtype(model, manifest))).float()


# What each --convert records: the manifest's format and serialized file (the digits model's).
WRITES = {
    "torchscript-trace": ("torchscript", "model.pt"),
    "torchscript-script": ("torchscript", "model.pt"),
    "export": ("exported", "model.pt2"),
    "none": ("eager", "digits.pt"),
}


@pytest.mark.parametrize(
    ("convert", "precision"),
    [
        ("torchscript-trace", "fp32"),
        ("torchscript-script", "fp32"),
        ("export", "fp32"),
        ("none", "fp32"),
        ("torchscript-trace", "int8-dynamic"),
        ("torchscript-trace", "fp16"),
        ("torchscript-script", "bf16"),
        ("export", "fp16"),
        ("none", "fp16"),
        ("none", "int8-dynamic"),
        ("export", "int8-dynamic"),
    ],
)
def test_convert_and_precision(
    digits_options: dict, digits: Path, tmp_path: Path, convert: str, precision: str
) -> None:
    fmt, serialized = WRITES[convert]
    out = package(ArchiveOptions(**digits_options, convert=convert, precision=precision))
    m = read_manifest(out)
    tb = m.torchbay
    assert (tb.format, tb.precision, m.model.serialized_file) == (fmt, precision, serialized)
    assert (m.model.model_file == "model.py") == (fmt == "eager")
    assert tb.parity is not None and tb.parity.passed and tb.parity.top1_agreement == 1.0
    assert tb.example_input == "example_input.npy" and tb.input_shape == [1, 8, 8]
    example = torch.load(digits / "example_input.pt", weights_only=True)
    reference = None
    for batch in (1, 3):  # any batch size runs, not just the traced one
        x = example[:batch]
        got = _load_and_run(out, tmp_path / f"x{batch}", x)
        assert got.shape == (batch, 10)
        if reference is None:
            reference = got
        assert torch.equal(got[:1].argmax(1), reference.argmax(1))


def test_optimize_freezes_torchscript(digits_options: dict) -> None:
    out = package(ArchiveOptions(**digits_options, convert="torchscript-trace", optimize=True))
    tb = read_manifest(out).torchbay
    assert tb.optimized and tb.parity.passed and tb.parity.max_rel_error < 1e-4
    with pytest.raises(ArchiveArgumentError, match=r"TorchScript only"):
        package(ArchiveOptions(**digits_options, convert="export", optimize=True, force=True))


def test_parity_refusal_and_allow_drift(digits_options: dict) -> None:
    opts = {**digits_options, "convert": "torchscript-trace", "precision": "int8-dynamic"}
    drift = r"max_rel_error .* > tolerance 1e-09.*--allow-drift"
    with pytest.raises(ParityError, match=drift) as e:
        package(ArchiveOptions(**opts, tolerance=1e-9))
    assert e.value.parity["max_rel_error"] > 1e-9
    assert not (Path(digits_options["export_path"]) / "digits.mar").exists()
    out = package(ArchiveOptions(**opts, tolerance=1e-9, allow_drift=True))
    parity = read_manifest(out).torchbay.parity
    assert not parity.passed and parity.allowed_drift and parity.tolerance.max_rel_error == 1e-9
    loose = package(ArchiveOptions(**opts, tolerance=0.5, force=True))
    assert read_manifest(loose).torchbay.parity.passed


def test_precision_the_model_cannot_take(tmp_path: Path, digits_options: dict) -> None:
    conv_file, conv_state = write_conv_model(tmp_path)
    opts = {
        **digits_options,
        "model_file": conv_file,
        "serialized_file": conv_state,
        "convert": "torchscript-trace",
        "precision": "int8-dynamic",
    }
    with pytest.raises(ConversionError, match=r"only Linear layers.* none .*Conv2d"):
        package(ArchiveOptions(**opts))


@pytest.mark.parametrize(
    ("fmt", "suffix"),
    [("default", ".mar"), ("zip-store", ".mar"), ("tgz", ".tar.gz"), ("no-archive", "")],
)
def test_archive_formats(digits_options: dict, tmp_path: Path, fmt: str, suffix: str) -> None:
    opts = {**digits_options, "archive_format": fmt, "example_input": None}
    out = package(ArchiveOptions(**opts))
    assert out.name == "digits" + suffix
    if fmt in ("default", "zip-store"):
        want = zipfile.ZIP_DEFLATED if fmt == "default" else zipfile.ZIP_STORED
        with zipfile.ZipFile(out) as zf:
            assert {i.compress_type for i in zf.infolist()} == {want}
            assert "MAR-INF/MANIFEST.json" in zf.namelist()
    elif fmt == "tgz":
        with tarfile.open(out) as tf:
            assert "digits/MAR-INF/MANIFEST.json" in tf.getnames()
    else:
        assert (out / "MAR-INF" / "MANIFEST.json").is_file()
    m = extract_archive(out, tmp_path / "x")
    assert m.torchbay.format == "eager" and m.torchbay.parity is None
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == [
        "MAR-INF", "digits.pt", "index_to_name.json", "model-config.yaml", "model.py",
    ]  # fmt: skip
    with pytest.raises(ArchiveArgumentError, match=r"already exists.*--force"):
        package(ArchiveOptions(**opts))
    assert package(ArchiveOptions(**opts, force=True)) == out


def test_extra_files_requirements_config_and_handler_file(
    digits_options: dict, tmp_path: Path
) -> None:
    extra = tmp_path / "assets"
    (extra / "nested").mkdir(parents=True)
    (extra / "vocab.txt").write_text("a\nb\n")
    (extra / "nested" / "x.json").write_text("{}")
    (extra / "__pycache__").mkdir()
    (extra / "__pycache__" / "junk.pyc").write_bytes(b"x")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    handler = tmp_path / "src" / "my_handler.py"
    handler.parent.mkdir()
    handler.write_text("def handle(data, context):\n    return [1 for _ in data]\n")
    opts = {
        **digits_options,
        "example_input": None,
        "export_path": tmp_path,
        "handler": f"{handler}:handle",
        "extra_files": f"{digits_options['extra_files']},{extra}",
        "requirements_file": tmp_path / "requirements.txt",
    }
    out = package(ArchiveOptions(**opts))
    m = read_manifest(out)
    assert m.model.handler == "my_handler.py:handle"
    assert m.model.requirements_file == "requirements.txt"
    assert m.model.config_file == "model-config.yaml"
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
    assert {"my_handler.py", "vocab.txt", "nested/x.json", "requirements.txt"} <= names
    assert not any("__pycache__" in n for n in names)
    assert set(m.torchbay.files) == names - {"MAR-INF/MANIFEST.json"}


def test_bad_arguments(digits_options: dict, tmp_path: Path) -> None:
    with pytest.raises(ArchiveArgumentError, match=r"unknown handler 'nope'"):
        package(ArchiveOptions(**{**digits_options, "handler": "nope"}))
    with pytest.raises(ArchiveArgumentError, match=r"--serialized-file .*does not exist"):
        package(ArchiveOptions(**{**digits_options, "serialized_file": tmp_path / "missing.pt"}))
    with pytest.raises(ArchiveArgumentError, match=r"--extra-files"):
        package(ArchiveOptions(**{**digits_options, "extra_files": str(tmp_path / "gone")}))
    with pytest.raises(ArchiveArgumentError, match=r"--example-input"):
        package(ArchiveOptions(**{**digits_options, "example_input": None, "convert": "export"}))
    for text, words in (("a: [1", "is not valid YAML"), ("- batchSize: 4\n", "YAML mapping")):
        config = tmp_path / "model-config.yaml"
        config.write_text(text)  # packed before, then the model failed when it loaded
        with pytest.raises(ArchiveArgumentError, match=rf"--config-file .*{words}"):
            package(ArchiveOptions(**{**digits_options, "config_file": config}))


TRANSFORMER = """\
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))
"""


@pytest.mark.parametrize("convert", ["torchscript-trace", "export"])
def test_transformer_encoder_trace_and_export(tmp_path: Path, convert: str) -> None:
    (tmp_path / "encoder.py").write_text(TRANSFORMER)
    namespace: dict = {}
    exec(compile(TRANSFORMER, "encoder.py", "exec"), namespace)
    torch.manual_seed(0)
    torch.save(namespace["Encoder"]().state_dict(), tmp_path / "encoder.pt")
    torch.save(torch.randn(4, 5, 16), tmp_path / "x.pt")
    out = package(
        tensor_options("enc", tmp_path, "encoder.py", "encoder.pt", "x.pt", convert=convert)
    )
    tb = read_manifest(out).torchbay
    assert tb.parity.passed and tb.parity.max_rel_error < 1e-4 and tb.input_shape == [5, 16]
    for batch in (1, 3):
        got = _load_and_run(out, tmp_path / f"o{batch}", torch.randn(batch, 5, 16))
        assert got.shape == (batch, 4)
    assert json.loads(json.dumps(tb.model_dump()))["format"] in ("torchscript", "exported")
