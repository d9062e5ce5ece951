"""What the latency scripts of results/ (cache/latency.py, shm/latency.py) share: their command
line, a scratch model store and work folder, and the archive of a TorchScript model with the
tensor handler, made by ``torchbay archive`` as a user would. Each script puts this folder on
``sys.path`` (a script's own folder is the one Python adds) and imports this module by name."""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


def rounds_and_requests(doc: str, rounds: int, requests: int) -> argparse.Namespace:
    """``--rounds`` and ``--requests`` (per mode and round), with the script's defaults; ``doc``
    is its docstring, whose first paragraph ``--help`` shows."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--requests", type=int, default=requests, help="per mode and round")
    return parser.parse_args()


@contextlib.contextmanager
def scratch() -> Iterator[tuple[Path, Path]]:
    """A model store and a work folder, both removed on leaving."""
    with tempfile.TemporaryDirectory() as tmp:
        store, work = Path(tmp, "store"), Path(tmp, "work")
        store.mkdir()
        work.mkdir()
        yield store, work


def archive(store: Path, work: Path, name: str) -> Path:
    """``torchbay archive`` of ``work/<name>.pt`` (version 1, the tensor handler) with its
    example input ``work/example.pt`` and ``work/model-config.yaml``, into ``store``."""
    command = [sys.executable, "-m", "torchbay", "archive", "--model-name", name]
    command += ["--version", "1", "--handler", "tensor", "--export-path", str(store)]
    command += ["--serialized-file", str(work / f"{name}.pt")]
    command += ["--example-input", str(work / "example.pt")]
    command += ["--config-file", str(work / "model-config.yaml")]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return store / f"{name}.mar"
