"""Shared by tests/server/test_cli_*.py: the real ``torchbay`` command in a temporary directory,
a store with a handler that prints, and a finalizer that kills whatever a test started."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from .conftest import build_store

PID_FILE = ".model_server.pid"
# The tiny TorchScript model of conftest._tiny_model takes 64 numbers.
INPUT = [0.5] * 64
TALK_HANDLER = """
import sys

from torchbay.handlers.tensor import TensorHandler


class TalkHandler(TensorHandler):
    def postprocess(self, output):
        print("talk handler: print on stdout", flush=True)
        print("talk handler: print on stderr", file=sys.stderr, flush=True)
        return super().postprocess(output)
"""


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """os.environ without torchbay/TorchServe settings; TMPDIR (the pid file's folder) = tmp;
    gRPC on free ports (a server beside the tests may hold 7070/7071)."""
    drop = ("TORCHBAY_", "TS_", "LOG_LOCATION", "METRICS_LOCATION", "TEMP", "TMP")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    tmp.mkdir(parents=True, exist_ok=True)
    grpc = {"TORCHBAY_GRPC_INFERENCE_PORT": "0", "TORCHBAY_GRPC_MANAGEMENT_PORT": "0"}
    return {**env, "TMPDIR": str(tmp), **grpc, **extra}


def torchbay(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchbay", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )


def free_addresses() -> list[str]:
    args = []
    for name in ("inference", "management", "metrics"):
        args += [f"--{name}-address", "http://127.0.0.1:0"]
    return args


def predict(port: int, model: str = "talk") -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/predictions/{model}", json=INPUT, timeout=60)


TEMPLATE = "torchbay.server.worker.template"


def spawned_workers(pid: int) -> list[psutil.Process]:
    """The worker processes the server ``pid`` spawned: its children, less its worker template
    (serving/forkserver.py: a template is no worker)."""
    return [p for p in psutil.Process(pid).children() if TEMPLATE not in p.cmdline()]


def all_workers(pid: int) -> list[psutil.Process]:
    """Every worker process of the server ``pid``: those it spawned, and those forked from its
    template (the template's children, which carry its command line)."""
    templates = [p for p in psutil.Process(pid).children() if TEMPLATE in p.cmdline()]
    return spawned_workers(pid) + [child for t in templates for child in t.children()]


def kill_tree(pid: int) -> None:
    """Kill a server this test started (and its workers) if it is still there."""
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        family = [proc, *proc.children(recursive=True)]
        for member in family:
            with contextlib.suppress(psutil.Error):
                member.kill()
        psutil.wait_procs(family, timeout=30)


def wait_gone(pid: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def read_ready(path: Path) -> dict:
    return json.loads(path.read_text())


def lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def build_talk_store(factory: pytest.TempPathFactory, name: str) -> Path:
    """A model store holding ``talk.mar``, served by :data:`TALK_HANDLER`."""
    handler = factory.mktemp(f"{name}-src") / "talk_handler.py"
    handler.write_text(TALK_HANDLER)
    return build_store(factory, name, {"talk": str(handler)})


def serve_foreground(
    args: list[str], cwd: Path, env: dict[str, str], stdout: int = subprocess.DEVNULL
) -> tuple[subprocess.Popen, dict]:
    """``python -m torchbay serve --foreground --ncs ARGS`` on free ports in ``cwd``, once its
    ready file is written: (the process, the ready file). Stop it with :func:`kill_tree`."""
    ready = cwd / "ready.json"
    command = [sys.executable, "-m", "torchbay", "serve", "--foreground", "--ncs", *args]
    command += ["--ready-file", str(ready), *free_addresses()]
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 100
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_tree(proc.pid)
            raise AssertionError(f"never became ready (exit {proc.poll()})")
        time.sleep(0.05)
    return proc, read_ready(ready)


# A sitecustomize.py that holds one process at the import of one module: the first process of
# the tree (the marker is created with O_EXCL) that imports HOLD_IMPORT creates HOLD_MARK, then
# sleeps (60 s at most) in that import, where a test signals it: a point of a start that no
# timing reaches reliably (the CLI's imports, a server before its event loop owns its signals).
_HOLD = """
import importlib.abc, os, sys, time

class _Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == os.environ["HOLD_IMPORT"]:
            try:
                os.close(os.open(os.environ["HOLD_MARK"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return None
            end = time.monotonic() + 60
            while time.monotonic() < end:
                time.sleep(0.01)
        return None

if os.environ.get("HOLD_IMPORT"):
    sys.meta_path.insert(0, _Hold())
"""


def hold_import(folder: Path, module: str) -> tuple[dict[str, str], Path]:
    """(environment variables, marker): a ``torchbay`` run with them holds at the import of
    ``module`` once the marker exists (see _HOLD)."""
    site = folder / "hold-site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(_HOLD)
    marker = folder / "held"
    path = os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))
    env = {"PYTHONPATH": path, "HOLD_IMPORT": module, "HOLD_MARK": str(marker)}
    return env, marker


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 100.0) -> None:
    """Until ``path`` exists; fails if ``proc`` exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"exited {proc.returncode} before {path.name} existed"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)
