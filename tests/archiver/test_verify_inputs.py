"""``torchbay verify ARCHIVE --input FILE...``: every input answered and shown; 5xx fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchbay.archiver.package import ArchiveOptions, package
from torchbay.cli import main

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
