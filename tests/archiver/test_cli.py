"""The verbs as a user runs them: acceptance on digits, TorchServe archives, bad inputs."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import zipfile
from pathlib import Path

import pytest
import torch

from tests.torchserve_archivers import run_archiver
from torchbay.archiver.manifest import read_manifest
from torchbay.archiver.package import ArchiveOptions, package
from torchbay.cli import main

from .conftest import run_torchbay, write_conv_model


def _archive_args(digits: Path, store: Path, name: str) -> list[str]:
    return [
        "archive", "--model-name", name, "-v", "1.0",
        "--serialized-file", str(digits / "digits.pt"), "--model-file", str(digits / "model.py"),
        "--handler", "image_classifier", "--extra-files", str(digits / "index_to_name.json"),
        "-c", str(digits / "model-config.yaml"),
        "--example-input", str(digits / "example_input.pt"), "--export-path", str(store),
    ]  # fmt: skip


def _top_label(stdout: str) -> str:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("output:"))
    scores = json.loads(line.split(":", 1)[1])
    return max(scores, key=scores.get)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "flags", "digit"),
    [
        ("d-int8", ["--convert", "torchscript-trace", "--precision", "int8-dynamic"], 3),
        ("d-fp16", ["--convert", "torchscript-trace", "--precision", "fp16"], 7),
        ("d-export", ["--convert", "export"], 5),
    ],
)
def test_acceptance_archive_inspect_verify_digits(
    digits: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name, flags, digit
) -> None:
    assert main(_archive_args(digits, tmp_path, name) + flags) == 0
    mar = tmp_path / f"{name}.mar"
    assert mar.is_file() and "wrote" in capsys.readouterr().out
    assert main(["inspect", str(mar)]) == 0
    text = capsys.readouterr().out
    assert "parity:     passed: max_abs_error=" in text and "top1_agreement=1.000" in text
    assert main(["inspect", "--json", str(mar)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["manifest"]["torchbay"]["parity"]["passed"] is True
    sample = digits / f"sample_{digit}.png"
    assert main(["verify", str(mar), "--input", str(sample)]) == 0
    out = capsys.readouterr().out
    assert _top_label(out) == str(digit)
    assert "preprocess" in out and "inference" in out and "verify: OK" in out


def test_verify_subprocess_prints_digit_and_rejects_wrong_handler(
    digits: Path, tmp_path: Path
) -> None:
    assert main([*_archive_args(digits, tmp_path, "d"), "--convert", "torchscript-trace"]) == 0
    proc = run_torchbay("verify", str(tmp_path / "d.mar"), "--input", str(digits / "sample_4.png"))
    assert proc.returncode == 0, proc.stderr
    assert _top_label(proc.stdout) == "4"
    # The stored example (a tensor) goes to the tensor handler as one raw float32 sample.
    proc = run_torchbay("verify", str(tmp_path / "d.mar"), "--handler", "tensor")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout.split("output:", 1)[1].splitlines()[0])["output"]) == 10


TS_HANDLER = """\
import json

import torch
from ts.torch_handler.base_handler import BaseHandler


class DoubleHandler(BaseHandler):
    def preprocess(self, data):
        rows = []
        for row in data:
            value = row.get("data") or row.get("body")
            if isinstance(value, (bytes, bytearray)):  # TorchServe parses JSON bodies itself
                value = json.loads(value)
            rows.append(value)
        return torch.tensor(rows, dtype=torch.float32)

    def postprocess(self, data):
        return [{"sum": float(row.sum())} for row in data]
"""


@pytest.mark.slow
def test_torch_model_archiver_archive_passes_verify(tmp_path: Path) -> None:
    archiver = shutil.which("torch-model-archiver") or str(
        Path(__import__("sys").executable).parent / "torch-model-archiver"
    )
    model = torch.jit.script(torch.nn.Linear(4, 2).eval())
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(0.0)
    torch.jit.save(model, str(tmp_path / "linear.pt"))
    (tmp_path / "double_handler.py").write_text(TS_HANDLER)
    run_archiver(
        [
            archiver, "--model-name", "linear", "--version", "1.0",
            "--serialized-file", str(tmp_path / "linear.pt"),
            "--handler", str(tmp_path / "double_handler.py"), "--export-path", str(tmp_path),
        ],
        capture_output=True, timeout=120,
    )  # fmt: skip
    mar = tmp_path / "linear.mar"
    manifest = read_manifest(mar)
    assert manifest.torchbay is None and manifest.archiver_version == "0.12.0"
    assert manifest.model.handler == "double_handler.py"
    (tmp_path / "in.json").write_text("[1, 2, 3, 4]")
    proc = run_torchbay("verify", str(mar), "--input", str(tmp_path / "in.json"))
    assert proc.returncode == 0, proc.stderr
    assert '"sum": 20.0' in proc.stdout.replace('"sum":20.0', '"sum": 20.0')
    assert main(["inspect", str(mar)]) == 0


def _good_mar(tmp_path: Path) -> Path:
    """A small valid torchbay-style archive (tensor handler, no model needed to read)."""
    body = b"weights"
    manifest = {
        "createdOn": "01/01/2026 00:00:00",
        "runtime": "python",
        "archiverVersion": "0.1.0",
        "model": {"modelName": "m", "modelVersion": "1", "handler": "tensor"},
        "torchbay": {
            "format": "eager",
            "files": {"w.bin": hashlib.sha256(body).hexdigest()},
        },
    }
    mar = tmp_path / "good.mar"
    with zipfile.ZipFile(mar, "w") as zf:
        zf.writestr("w.bin", body)
        zf.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    return mar


def _with_member(tmp_path: Path, name: str, member: zipfile.ZipInfo | str, data: bytes) -> Path:
    src = _good_mar(tmp_path)
    out = tmp_path / f"{name}.mar"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info))
        zout.writestr(member, data)
    return out


def _bad_inputs(tmp_path: Path, digits: Path) -> dict[str, tuple[list[str], str]]:
    good = _good_mar(tmp_path)
    tampered = tmp_path / "tampered.mar"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(tampered, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, b"evil!!!" if info.filename == "w.bin" else data)
    corrupt = tmp_path / "corrupt.mar"
    corrupt.write_bytes(good.read_bytes()[:40])
    link = zipfile.ZipInfo("link.bin")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    conv_file, conv_state = write_conv_model(tmp_path)
    archive = ["archive", "--model-name", "x", "-v", "1", "--export-path", str(tmp_path)]
    int8_args = [
        *archive, "--handler", "tensor", "--model-file", str(conv_file),
        "--serialized-file", str(conv_state), "--convert", "torchscript-trace",
        "--precision", "int8-dynamic", "--example-input", str(digits / "example_input.pt"),
    ]  # fmt: skip
    example = ["--example-input", str(digits / "example_input.pt")]
    junk_pt2 = tmp_path / "junk.pt2"  # torch.export.load logged its traceback reading it
    junk_pt2.write_bytes(b"not a program")
    junk_mar = package(
        ArchiveOptions(
            model_name="junk",
            version="1",
            handler="tensor",
            serialized_file=junk_pt2,
            export_path=tmp_path / "junk",
        )
    )
    torch.save(torch.nn.Linear(2, 2), tmp_path / "whole.pt")  # the model, not its state dict
    (tmp_path / "empty.pt").touch()  # torch says nothing of it (an EOFError without a message)
    extra = tmp_path / "extra"
    (extra / "assets").mkdir(parents=True)
    (extra / "vocab.txt").write_text("a b")
    (extra / "assets" / "tokenizer").symlink_to(digits, target_is_directory=True)
    return {
        "missing file": (
            [*archive, "--handler", "tensor", "--serialized-file", str(tmp_path / "nope.pt")],
            "does not exist",
        ),
        "unknown handler": (
            [*archive, "--handler", "no_such_handler", "--serialized-file", str(good)],
            "unknown handler 'no_such_handler'",
        ),
        "corrupt zip": (["verify", str(corrupt)], "corrupt.mar"),
        "tampered member": (["verify", str(tampered)], "'w.bin': sha256 mismatch"),
        "dotdot member": (
            ["verify", str(_with_member(tmp_path, "dotdot", "../evil.py", b"x"))],
            "'../evil.py'",
        ),
        "absolute member": (
            ["verify", str(_with_member(tmp_path, "abs", "/tmp/evil.py", b"x"))],
            "'/tmp/evil.py': absolute path",
        ),
        "symlink member": (
            ["verify", str(_with_member(tmp_path, "sym", link, b"/etc/passwd"))],
            "'link.bin': symlink members are not allowed",
        ),
        "missing archive": (["inspect", str(tmp_path / "nothing.mar")], "no such archive"),
        "precision the model cannot take": (
            int8_args,
            "int8-dynamic quantizes only Linear",
        ),
        "linked folder in extra files": (  # was left out of the archive, unsaid
            [
                *archive,
                "--handler",
                "tensor",
                "--serialized-file",
                str(good),
                "--extra-files",
                str(extra),
            ],
            f"--extra-files: {extra / 'assets' / 'tokenizer'} is a link",
        ),
        "a .pt2 that is no program": (
            [*archive, "--handler", "tensor", "--serialized-file", str(junk_pt2), *example],
            "'junk.pt2' is not a torch.export program",
        ),
        "verify a .pt2 that is no program": (
            ["verify", str(junk_mar), "--input", str(junk_pt2)],
            "cannot load exported model 'junk.pt2'",
        ),
        "empty example input": (
            [*int8_args[:-4], "--example-input", str(tmp_path / "empty.pt")],
            "cannot read example input 'empty.pt': the file is empty",
        ),
        "a whole model for a state dict": (  # was torch's words, cut, with terminal codes
            [*int8_args[:-4], *example, "--serialized-file", str(tmp_path / "whole.pt")],
            "'whole.pt' (weights_only): it holds pickled objects, not only tensors",
        ),
        "export path under a file": (  # was a NotADirectoryError traceback
            [
                *archive[:-1],
                str(good / "sub"),
                "--handler",
                "tensor",
                "--serialized-file",
                str(good),
            ],
            f"--export-path {str(good / 'sub')!r} cannot be made: Not a directory",
        ),
    }


CASES = [
    "missing file",
    "unknown handler",
    "corrupt zip",
    "tampered member",
    "dotdot member",
    "absolute member",
    "symlink member",
    "missing archive",
    "precision the model cannot take",
    "export path under a file",
    "linked folder in extra files",
    "a .pt2 that is no program",
    "verify a .pt2 that is no program",
    "empty example input",
    "a whole model for a state dict",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gives_one_error_line_and_exit_1(case: str, tmp_path: Path, digits: Path) -> None:
    args, expected = _bad_inputs(tmp_path, digits)[case]
    proc = run_torchbay(*args)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("torchbay: error:")]
    assert len(errors) == 1, proc.stderr
    assert expected in errors[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--tolerance", "nan", "tolerance: Input should be a finite number"),
        ("--tolerance", "-1", "tolerance: Input should be greater than or equal to 0"),
        ("--min-top1-agreement", "2", "min_top1_agreement: Input should be less than or equal"),
    ],
)
def test_a_parity_limit_that_is_no_limit_is_refused(
    flag: str, value: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--tolerance nan passed every model (NaN compares false) and wrote NaN, which is no JSON,
    into the manifest; a negative tolerance or an agreement above 1 refused every model as drift."""
    model_file, state = write_conv_model(tmp_path)
    torch.save(torch.randn(2, 1, 5, 5), tmp_path / "x.pt")
    args = [
        *("archive", "--model-name", "c", "-v", "1", "--handler", "tensor"),
        *("--model-file", str(model_file), "--serialized-file", str(state)),
        *("--example-input", str(tmp_path / "x.pt"), "--export-path", str(tmp_path)),
    ]
    assert main([*args, flag, value]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "c.mar").exists()


@pytest.mark.parametrize("verb", ["inspect", "verify"])
def test_a_workflow_archive_is_named_as_one(verb: str, tmp_path: Path) -> None:
    """``torchbay inspect`` / ``verify`` on a ``.war`` said only ``no MAR-INF/MANIFEST.json in
    the archive``: they now say it is a workflow archive and that it is registered with
    ``POST /workflows``."""
    war = tmp_path / "flow.war"
    with zipfile.ZipFile(war, "w") as zf:
        zf.writestr("WAR-INF/MANIFEST.json", json.dumps({"workflow": {"workflowName": "flow"}}))
        zf.writestr("flow.yaml", "models: {}\ndag: {a: []}\n")
    proc = run_torchbay(verb, str(war))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("torchbay: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "flow.war: a workflow archive (WAR-INF/MANIFEST.json), not a model archive" in errors[0]
    assert "POST /workflows?url=" in errors[0]
