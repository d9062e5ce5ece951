"""End to end: the SageMaker PyTorch toolkit (2.0.25) starts torchbay with its own start code
and configuration, and a user's ``code/inference.py`` serves unchanged through the toolkit's
handler service (``default_service_handler``), as a bring-your-own container runs it.

``torchserve`` on PATH is a two-line script running ``torchbay serve``; the toolkit's
``serving.main()`` writes its config.properties (run-on line and all), runs
``torchserve --start --model-store ... --ts-config ... --log-config ... --models model=<dir>``,
finds the server by TorchServe's class name on its command line and waits on it; SIGTERM to
the toolkit stops the server (toolkit_driver.py says what of the toolkit is pointed at the test).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.sagemaker.helpers import INPUT, clean_env, free_port, make_model_dir

DRIVER = Path(__file__).with_name("toolkit_driver.py")


def shim(folder: Path) -> Path:
    folder.mkdir()
    script = folder / "torchserve"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torchbay serve "$@"\n')
    script.chmod(0o755)
    return folder


def start_toolkit(tmp: Path, **env: str) -> tuple[subprocess.Popen, int, Path]:
    """The toolkit's ``serving.main()`` (toolkit_driver.py) in ``tmp``, with ``torchserve`` on
    PATH the shim and SageMaker's base folder ``tmp/ml``; ``env`` adds to its environment.
    Returns the driver's process, the port it binds and its log."""
    port = free_port()
    env = clean_env(
        tmp,
        PATH=f"{shim(tmp / 'bin')}:{clean_env(tmp)['PATH']}",
        SAGEMAKER_BASE_DIR=str(tmp / "ml"),
        SAGEMAKER_BIND_TO_PORT=str(port),
        **env,
    )
    log = tmp / "toolkit.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(DRIVER), str(tmp / "sagemaker-ts.properties")],
            cwd=tmp,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, port, log


def first_answer(url: str, proc: subprocess.Popen, log: Path) -> httpx.Response:
    """The first answer of the model, once the toolkit's server has loaded it."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the toolkit exited ({proc.returncode}): {log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.post(url, json=INPUT, timeout=30)
            if r.status_code not in (400, 404, 503):  # not loaded yet
                return r
        time.sleep(0.5)
    pytest.fail(f"no answer from the toolkit's server: {log.read_text()[-3000:]}")


def servers(folder: Path) -> list[psutil.Process]:
    """The torchbay servers working in ``folder`` (``--start``'s child, which has TorchServe's
    class on its command line; it left the toolkit's process tree when ``--start`` exited)."""
    found = []
    for proc in psutil.process_iter():
        # gone, a zombie, or not ours to read; psutil 5.x lets a process that exits while
        # its cwd link is read escape as FileNotFoundError (another test's, on this host)
        with contextlib.suppress(psutil.Error, FileNotFoundError):
            if proc.cwd() == str(folder) and "org.pytorch.serve.ModelServer" in proc.cmdline():
                found.append(proc)
    return found


def kill_family(proc: subprocess.Popen) -> None:
    with contextlib.suppress(psutil.Error):
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for member in family:
            with contextlib.suppress(psutil.Error):
                member.kill()
        psutil.wait_procs(family, timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("model", {"scores": [[14.5, 31.5]]}),
        ("transform", {"transformed": [[14.5, 31.5]], "accept": "application/json"}),
    ],
)
def test_the_toolkit_starts_torchbay_and_serves_inference_py(
    tmp_path: Path, code: str, expected: dict
) -> None:
    make_model_dir(tmp_path / "ml" / "model", code=code)
    config = tmp_path / "sagemaker-ts.properties"
    proc, port, log = start_toolkit(tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/invocations"
        r = first_answer(url, proc, log)
        assert (r.status_code, r.json()) == (200, expected), r.text
        assert r.headers["content-type"] == "application/json"
        # The toolkit wrote its file with its flaw; torchbay warned and read it as Java does.
        assert "enable_model_api=truedefault_response_timeout=60" in config.read_text()
        assert (
            "enable_model_api='truedefault_response_timeout=60' reads as false" in log.read_text()
        )
        invoked = httpx.post(f"http://127.0.0.1:{port}/models/model/invoke", json=INPUT)
        assert invoked.json() == expected
        if code == "model":  # the user's input_fn refuses CSV: the toolkit's 500, through us
            refused = httpx.post(url, content=b"1,2,3", headers={"Content-Type": "text/csv"})
            assert refused.status_code == 500
            assert "this model takes application/json, not text/csv" in refused.text
        server = servers(tmp_path)
        assert len(server) == 1  # the toolkit found and waits on this one
        proc.send_signal(signal.SIGTERM)  # the toolkit passes it on to the server
        assert proc.wait(180) == 0
        assert psutil.wait_procs(server, timeout=30)[1] == []
    finally:
        kill_family(proc)
        for leftover in servers(tmp_path):
            leftover.kill()
