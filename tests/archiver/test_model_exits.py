"""A model file that ends the process when it is imported (``sys.exit()``, ``os._exit()``, a
raised ``KeyboardInterrupt``): ``torchbay archive --convert`` and ``torchbay verify`` import it,
and ended with it, with no word (``sys.exit(0)``: exit status 0, ``verify`` passed, nothing
written). Each is now the archiver's one error line naming the file, exit status 1; a real
Ctrl-C still stops the command (130)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tiny_sources import TINY_LINEAR_SOURCE, saved_model

from .conftest import run_torchbay

EXITS = {
    "sys.exit(0)": ("import sys\nsys.exit(0)\n", "SystemExit(0)"),
    "os._exit(0)": ("import os\nos._exit(0)\n", "os._exit(0) called"),
    "KeyboardInterrupt": ("raise KeyboardInterrupt\n", "KeyboardInterrupt()"),
}


def _model_folder(tmp_path: Path, first_lines: str) -> Path:
    """tiny.py (``first_lines``, then the Tiny class), its state dict and an example input."""
    import torch

    saved_model(tmp_path, "tiny.py", TINY_LINEAR_SOURCE, "Tiny", "tiny.pt")
    (tmp_path / "tiny.py").write_text(first_lines + TINY_LINEAR_SOURCE)
    torch.save(torch.randn(2, 4), tmp_path / "x.pt")
    (tmp_path / "in.json").write_text('{"data": [[1, 2, 3, 4]]}')
    return tmp_path


def _archive(folder: Path, *extra: str) -> list[str]:
    files = ["--model-file", str(folder / "tiny.py"), "--serialized-file", str(folder / "tiny.pt")]
    name = ["--model-name", "tiny", "-v", "1", "--handler", "tensor"]
    return ["archive", *name, *files, "--export-path", str(folder), "-f", *extra]


def _one_error_line(proc: subprocess.CompletedProcess[str], words: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("torchbay: error:")]
    assert len(errors) == 1 and words in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("how", list(EXITS))
def test_a_model_file_that_exits_is_one_error_line(tmp_path: Path, how: str) -> None:
    first_lines, shown = EXITS[how]
    folder = _model_folder(tmp_path, first_lines)
    converted = _archive(folder, "--convert", "torchscript-trace", "--example-input", "x.pt")
    proc = run_torchbay(*converted, cwd=folder)
    _one_error_line(proc, f"importing 'tiny.py' failed: {shown}")
    assert not (folder / "tiny.mar").exists()
    # Packed as it is (torch-model-archiver's way: nothing imported), verify imports it.
    assert run_torchbay(*_archive(folder)).returncode == 0
    proc = run_torchbay("verify", str(folder / "tiny.mar"), "--input", str(folder / "in.json"))
    _one_error_line(proc, f"importing 'tiny.py' failed: {shown}")


def test_ctrl_c_while_the_model_file_is_imported_still_stops_the_archiver(tmp_path: Path) -> None:
    started = tmp_path / "started"
    folder = _model_folder(tmp_path, f"import time\nopen({str(started)!r}, 'w').close()\n")
    (folder / "tiny.py").write_text(
        (folder / "tiny.py").read_text().replace("close()\n", "close()\ntime.sleep(600)\n", 1)
    )
    converted = _archive(folder, "--convert", "torchscript-trace", "--example-input", "x.pt")
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchbay", *converted],
        cwd=folder,
        stderr=subprocess.PIPE,
        text=True,  # (SIGINT at its default, not ignored by a shell: tests/conftest.py)
    )
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), proc.stderr.read() if proc.poll() is not None else "not started"
        os.kill(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert not (folder / "tiny.mar").exists()
