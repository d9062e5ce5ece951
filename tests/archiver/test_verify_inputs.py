"""``torchbay verify ARCHIVE --input FILE...``: every input answered and shown; 5xx fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.tiny_sources import saved_model
from torchbay.archiver.package import ArchiveOptions, package
from torchbay.cli import main

from .conftest import run_torchbay

HANDLER = """\
from torchbay.handlers.errors import BadInput


def handle(data, context):
    if data is None:
        return None
    out = []
    for row in data:
        text = row["body"]
        if text == "boom":
            raise RuntimeError("the handler broke")
        if text == "bad":
            raise BadInput("say something else")
        out.append({"echo": text, "batch": len(data)})
    return out
"""


def _package(root: Path, name: str) -> Path:
    """``root/NAME.mar``: the handler ``root/NAME.py`` over the identity model ``root/id.pt``."""
    return package(
        ArchiveOptions(
            model_name=name,
            version="1.0",
            serialized_file=root / "id.pt",
            handler=str(root / f"{name}.py"),
            export_path=root,
        )
    )


@pytest.fixture(scope="module")
def echo_mar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify-inputs")
    torch.jit.save(torch.jit.script(torch.nn.Identity()), str(root / "id.pt"))
    (root / "echo.py").write_text(HANDLER)
    for word in ("hello", "world", "bad", "boom"):
        (root / f"{word}.txt").write_text(word)
    return _package(root, "echo")


def test_several_inputs_each_answered_in_batches(
    echo_mar: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    txt = [str(echo_mar.parent / f"{w}.txt") for w in ("hello", "world", "bad")]
    assert (
        main(["verify", str(echo_mar), "--input", *txt[:2], "--input", txt[2], "--batch-size", "2"])
        == 0
    )
    out = capsys.readouterr().out
    outputs = [ln for ln in out.splitlines() if ln.startswith("output:")]
    assert outputs[0] == 'output:  {"echo": "hello", "batch": 2}'
    assert outputs[1] == 'output:  {"echo": "world", "batch": 2}'
    assert "say something else" in outputs[2]
    assert out.count("status:  200") == 2 and "status:  400" in out
    assert out.rstrip().endswith("verify: OK (1 of 3 refused with a 4xx)")


def test_a_5xx_prints_every_response_and_exits_1(
    echo_mar: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = [str(echo_mar.parent / f"{w}.txt") for w in ("hello", "boom")]
    assert main(["verify", str(echo_mar), "--input", *inputs]) == 1
    captured = capsys.readouterr()
    assert 'output:  {"echo": "hello", "batch": 1}' in captured.out
    assert "status:  500" in captured.out and "verify: FAILED (1 of 2: 500)" in captured.out
    assert "boom.txt" in captured.err and "answered 500" in captured.err
    assert "Traceback" not in captured.out + captured.err


def test_missing_input_and_bad_batch_size_are_usage_errors(
    echo_mar: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", str(echo_mar), "--input", str(tmp_path / "nope.txt")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["verify", str(echo_mar), "--batch-size", "0", "--input", str(echo_mar)]) == 1
    assert "--batch-size must be at least 1" in capsys.readouterr().err


STREAMER = """\
from ts.protocol.otf_message_handler import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    words = data[0]["body"].split()
    for word in words[:-1]:
        send_intermediate_predict_response([word + " "], context.request_ids, "", 200, context)
    return [words[-1]]
"""


def test_a_streaming_handler_shows_its_parts(
    echo_mar: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = echo_mar.parent
    (root / "streamer.py").write_text(STREAMER)
    (root / "words.txt").write_text("one two three")
    streamer_mar = _package(root, "streamer")
    assert main(["verify", str(streamer_mar), "--input", str(root / "words.txt")]) == 0
    out = capsys.readouterr().out
    assert "output:  three" in out
    assert "stream:  2 parts, then the output: one two three" in out


TWO_INPUTS = """\
import torch
from torch import nn


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 3)

    def forward(self, a, b):
        return self.l(a) + b
"""


def test_a_model_of_two_inputs_is_verified_over_the_open_inference_protocol(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify refused the stored two-input example (asking for an OIP request) and then answered
    the OIP request it asked for with a 400 (it went the TorchServe way, as a JSON array)."""
    model = saved_model(tmp_path, "two.py", TWO_INPUTS, "Two", "two.pt")
    torch.save({"a": torch.randn(2, 4), "b": torch.randn(2, 3)}, tmp_path / "ab.pt")
    mar = package(
        ArchiveOptions(
            model_name="two",
            version="1.0",
            handler="tensor",
            model_file=tmp_path / "two.py",
            serialized_file=tmp_path / "two.pt",
            example_input=tmp_path / "ab.pt",
            export_path=tmp_path,
        )
    )
    assert main(["verify", str(mar)]) == 0
    out = capsys.readouterr().out
    assert "stored example example_input.npz[0] (a, b) as an OIP request" in out
    assert "status:  200" in out and '"name": "output0"' in out
    request = {
        "inputs": [
            {"name": "a", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "b", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
        ]
    }
    (tmp_path / "request.json").write_text(json.dumps(request))
    assert main(["verify", str(mar), "--input", str(tmp_path / "request.json")]) == 0
    out = capsys.readouterr().out
    assert "status:  200" in out, out
    answer = json.loads(out.split("output:  ", 1)[1].splitlines()[0])
    with torch.no_grad():
        expected = model(torch.tensor([[1.0, 2, 3, 4]]), torch.tensor([[1.0, 2, 3]]))
    assert answer["outputs"][0]["data"] == pytest.approx(expected[0].tolist(), rel=1e-5)


def test_a_handler_function_that_is_not_there_is_named_once(
    echo_mar: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The error named the handler twice: handler 'echo.py:nope': handler 'echo.py:nope': ..."""
    root = echo_mar.parent
    nope = package(
        ArchiveOptions(
            model_name="nope",
            version="1.0",
            serialized_file=root / "id.pt",
            handler=f"{root / 'echo.py'}:nope",
            export_path=root / "nope",
        )
    )
    assert main(["verify", str(nope), "--input", str(root / "hello.txt")]) == 1
    errors = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert errors == ["torchbay: error: handler 'echo.py:nope': 'echo.py' has no function 'nope'"]


def test_a_handler_failing_to_initialize_is_one_line(echo_mar: Path) -> None:
    """verify printed the handler's traceback (logged on the way) and named the handler twice:
    handler 'starts.py': handler 'starts.py' failed to initialize: RuntimeError(...)."""
    root = echo_mar.parent
    (root / "starts.py").write_text(
        "def handle(data, context):\n    raise RuntimeError('no GPU here')\n"
    )
    proc = run_torchbay("verify", str(_package(root, "starts")), "--input", str(root / "hello.txt"))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        "torchbay: error: handler 'starts.py' failed to initialize: RuntimeError('no GPU here')"
    ]
