"""Shared helpers for the deploy checks: paths, tool lookup, and the entrypoint run on the host."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from torchbay.archiver.package import ArchiveOptions, package

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ENTRYPOINT = DEPLOY / "docker" / "entrypoint.sh"
VENV_BIN = Path(sys.executable).parent
SAMPLE = [float(i % 7) / 7.0 for i in range(64)]  # one input of the archive's model
# The image's and KServe's configs bind gRPC on 0.0.0.0:7070/7071, which any other server on the
# host (a second test run, a TorchServe) may hold: free ports on loopback here (the variables win
# over config.properties).
GRPC_ON_FREE_PORTS = {
    "TORCHBAY_GRPC_INFERENCE_ADDRESS": "127.0.0.1",
    "TORCHBAY_GRPC_MANAGEMENT_ADDRESS": "127.0.0.1",
    "TORCHBAY_GRPC_INFERENCE_PORT": "0",
    "TORCHBAY_GRPC_MANAGEMENT_PORT": "0",
}


def find_tool(name: str, *extra_dirs: Path) -> str | None:
    """A command on PATH, next to this Python, or in one of ``extra_dirs``."""
    for folder in (VENV_BIN, *extra_dirs):
        candidate = folder / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def require_tool(name: str, how: str, *extra_dirs: Path) -> str:
    found = find_tool(name, *extra_dirs)
    if found is None:
        pytest.skip(f"{name} is not installed ({how})")
    return found


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def free_port() -> int:
    """A port the kernel just handed out, for the one check that needs two listeners to name the
    same fixed address (port 0 is two ports). Bound and released: a tiny race, no fixed number."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Container:
    """``entrypoint.sh serve`` run on the host, as the image's ENTRYPOINT runs it."""

    def __init__(self, env: dict[str, str], cwd: Path, ready_file: Path) -> None:
        self.ready_file = ready_file
        self.log = (cwd / "entrypoint.log").open("w+b")
        full_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("TORCHBAY_", "TS_"))},
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "TORCHBAY_READY_FILE": str(ready_file),
            **env,
        }
        self.proc = subprocess.Popen(
            ["sh", str(ENTRYPOINT), "serve"],
            env=full_env,
            cwd=cwd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, deadline_s: float = 90.0) -> dict[str, Any]:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.ready_file.is_file():
                return json.loads(self.ready_file.read_text())
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)  # polling a file the server writes, bounded by the deadline
        raise AssertionError(f"entrypoint did not get ready:\n{self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-4000:]

    def stop(self) -> int:
        """SIGTERM (what tini forwards on `docker stop`): the server drains and exits 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def container() -> Iterator[Any]:
    started: list[Container] = []

    def start(env: dict[str, str], cwd: Path) -> Container:
        run = Container(env, cwd, cwd / "ready.json")
        started.append(run)
        return run

    yield start
    for run in started:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        run.log.close()


@pytest.fixture(scope="session")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mnist.mar``: the built-in tensor handler over a tiny TorchScript model (64 -> 10)."""
    work = tmp_path_factory.mktemp("deploy-archive")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
    torch.jit.save(torch.jit.script(model.eval()), str(work / "model.pt"))
    return package(
        ArchiveOptions(
            model_name="mnist",
            version="1.0",
            serialized_file=work / "model.pt",
            handler="tensor",
            export_path=work,
        )
    )


@pytest.fixture(scope="session")
def image_server(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The image's own layout and config.properties (load_models=all, token auth on) run by the
    entrypoint from TORCHBAY_HOME, addresses from TORCHBAY_HOST and the port variables.
    Yields (run, ports, keys); stopping it with SIGTERM must exit 0."""
    root = tmp_path_factory.mktemp("image-layout")
    home = root / "home"
    (home / "model-store").mkdir(parents=True)
    shutil.copy(archive, home / "model-store" / "mnist.mar")
    shutil.copy(DEPLOY / "docker" / "config.properties", home / "config.properties")
    env = {
        "TORCHBAY_KSERVE_ROOT": str(root / "no-kserve"),
        "TORCHBAY_HOME": str(home),
        "TORCHBAY_HOST": "127.0.0.1",
        "TORCHBAY_INFERENCE_PORT": "0",
        "TORCHBAY_MANAGEMENT_PORT": "0",
        "TORCHBAY_METRICS_PORT": "0",
        **GRPC_ON_FREE_PORTS,
    }
    run = Container(env, home, home / "ready.json")
    try:
        ports = run.wait_ready()
        keys = json.loads((home / "key_file.json").read_text())
        yield run, ports, keys
        assert run.stop() == 0, run.output()
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        run.log.close()
