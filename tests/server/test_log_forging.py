"""A client's line breaks in text a handler logs or prints (as many of TorchServe's examples log
their input) cannot forge a record of the server's in ``model_log.log`` or ``ts_log.log``: only a
worker's own records are written as the worker formatted them; every other line a worker writes
is a ``torchbay.model_log`` record of its own, as TorchServe 0.12 prefixes every line of its
workers' output (tests/data/torchserve/log_forging, recorded with its ``record.py``). ANSI
escapes that would erase a line on an operator's terminal are written escaped (TorchServe writes
them raw)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import httpx
import pytest

from torchbay.archiver.package import ArchiveOptions, package

from .cli_helpers import clean_env, kill_tree, serve_foreground

pytestmark = pytest.mark.slow

RECORD = Path(__file__).parents[1] / "data" / "torchserve" / "log_forging"
TORCHSERVE = json.loads((RECORD / "answers.json").read_text())
BODY = TORCHSERVE["body"]  # hello, a forged text line, a forged JSON record, ANSI escapes
JSON_LINE = '{"logger": "torchbay.serve", "message": "forged"}'
ESCAPES = "\\x1b[1A\\x1b[2K"  # cursor up a line, erase it: as the log writes them, escaped
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def test_torchserve_prefixes_every_line_of_its_workers_output() -> None:
    """The record: each line the handler wrote, the forged ones too, after TorchServe's prefix."""
    for lines in TORCHSERVE["logs"].values():
        assert len(lines) == 7, lines
        assert all(" MODEL_LOG - " in line for line in lines)
        assert lines[-1].endswith("secret seen: None")
        assert sum("\x1b[1A\x1b[2K" in line for line in lines) == 2  # written raw


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_client_cannot_forge_server_records_through_a_handlers_output(
    tmp_path: Path, log_format: str
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    handler = RECORD / "echo_handler.py"
    package(
        ArchiveOptions(model_name="echo", handler=str(handler), export_path=store, version="1.0")
    )
    cwd, logs = tmp_path / "run", tmp_path / "logs"
    cwd.mkdir()
    env = clean_env(tmp_path / "tmp", LOG_LOCATION=str(logs))
    args = ["--model-store", str(store), "--models", "echo=echo.mar", "--disable-token-auth"]
    proc, ready = serve_foreground([*args, "--log-format", log_format], cwd, env)
    try:
        url = f"http://127.0.0.1:{ready['inference']}/predictions/echo"
        answer = httpx.post(url, content=BODY, headers={"content-type": "text/plain"}, timeout=60)
        assert answer.status_code == 200, answer.text
        proc.send_signal(signal.SIGTERM)  # every line is written once it has stopped
        assert proc.wait(timeout=60) == 0
    finally:
        kill_tree(proc.pid)
    for name in ("model_log.log", "ts_log.log"):
        text = (logs / name).read_text()
        assert "\x1b" not in text
        assert "ignored unknown environment variable" not in text  # the secret is no setting
        check = _check_json if log_format == "json" else _check_text
        check([line for line in text.splitlines() if line.strip()])


def _check_text(lines: list[str]) -> None:
    # Every line starts with a time the server wrote: none with the client's, no secret before it.
    assert all(STAMP.match(line) and not line.startswith("2026-01-01") for line in lines), lines
    forged = [line for line in lines if "torchbay.access: forged" in line]
    assert len(forged) == 2  # the logged and the printed copy, each a model-log message
    assert all(" INFO torchbay.model_log: 2026-01-01 00:00:00,000 " in line for line in forged)
    # The handler's own record is the worker's, as it formatted it (not wrapped again).
    (own,) = [line for line in lines if "Received text" in line]
    assert re.search(r" INFO worker\[\d+\] echo_handler: Received text: 'hello$", own), own
    assert any(line.endswith("torchbay.model_log: secret seen: None") for line in lines)
    assert sum(line.endswith(JSON_LINE + ESCAPES) for line in lines) == 1  # printed
    assert sum(line.endswith(JSON_LINE + ESCAPES + "'") for line in lines) == 1  # logged


def _check_json(lines: list[str]) -> None:
    records = [json.loads(line) for line in lines]  # one JSON object a line
    assert not [r for r in records if r["logger"] == "torchbay.serve" and r["message"] == "forged"]
    printed = [r for r in records if r["message"] == JSON_LINE + ESCAPES]
    assert len(printed) == 1 and printed[0]["logger"] == "torchbay.model_log"
    (own,) = [r for r in records if r["message"].startswith("Received text")]
    # The worker's own record: its JSON writes the escapes as \u001b, none raw in the file.
    assert own["logger"] == "echo_handler" and own["message"].endswith("\x1b[2K'")
    assert {"message": "secret seen: None"}.items() <= next(
        r for r in records if r["message"].startswith("secret")
    ).items()
