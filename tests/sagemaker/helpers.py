"""Shared by tests/sagemaker: the SageMaker toolkit's configuration for a port, the model
directories of the TorchServe recording, and a free port (the toolkit writes one fixed port for
both inference and management, so port 0 would not share a listener as it does in SageMaker)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "sagemaker"
_spec = importlib.util.spec_from_file_location("sagemaker_model_dirs", DATA / "model_dirs.py")
assert _spec is not None and _spec.loader is not None
model_dirs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model_dirs)
INPUT = model_dirs.INPUT
make_model_dir = model_dirs.make_model_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toolkit_config(port: int, **env: str) -> str:
    """The config.properties text sagemaker-pytorch-inference 2.0.25 writes for ``port`` (its
    SAGEMAKER_BIND_TO_PORT), as its own ``_generate_ts_config_properties`` makes it."""
    from sagemaker_pytorch_serving_container import handler_service, torchserve

    saved = dict(os.environ)
    os.environ.update({"SAGEMAKER_BIND_TO_PORT": str(port), **env})
    try:
        return torchserve._generate_ts_config_properties(handler_service.__file__)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The test's environment without torchbay/TorchServe/SageMaker settings; the pid file in
    ``tmp``; gRPC and metrics on free ports (the toolkit's file names neither)."""
    drop = ("TORCHBAY_", "TS_", "SAGEMAKER_", "LOG_LOCATION", "METRICS_LOCATION", "TEMP", "TMP")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    own = {
        "TMPDIR": str(tmp),
        "LOG_LOCATION": str(tmp / "logs"),
        "TORCHBAY_GRPC_INFERENCE_PORT": "0",
        "TORCHBAY_GRPC_MANAGEMENT_PORT": "0",
        "TORCHBAY_METRICS_ADDRESS": "http://127.0.0.1:0",
    }
    return {**env, **own, **extra}


def serve_ready(tmp: Path, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """``torchbay serve <args> --foreground --ncs`` in ``tmp`` (its output in tmp/serve.log),
    returned once its ready file says the start-up models are loaded; the test fails with the
    log's tail if it exits first or takes more than 200 s."""
    ready = tmp / "ready.json"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "torchbay", "serve", *args]
    argv += ["--foreground", "--ncs", "--ready-file", str(ready)]
    with (tmp / "serve.log").open("ab") as log:
        proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 200
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"torchbay did not start: {(tmp / 'serve.log').read_text()[-3000:]}")
        time.sleep(0.2)
    return proc


def mme_config(port: int) -> str:
    """The config.properties text the toolkit writes with ``SAGEMAKER_MULTI_MODEL=true``: its
    module reads that variable as it is imported, so it is asked in a process of its own."""
    code = (
        "from sagemaker_pytorch_serving_container import handler_service, torchserve\n"
        "print(torchserve._generate_ts_config_properties(handler_service.__file__), end='')"
    )
    env = {**os.environ, "SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_BIND_TO_PORT": str(port)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout
