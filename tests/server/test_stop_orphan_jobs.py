"""A stop whose event loop still has a job running in its default executor (``to_thread``: an
archive being extracted for a registration the stop cut short, a read stuck on a hung mount):
the server ends within its stop bound. It waited for the job without a bound (the loop's close,
then the interpreter's exit joined its thread): a stopped server that never exited.

The stuck job is the test's: a thread job that never returns, put in the real server's default
executor once it is up, as such a job would be."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from torchbay.server.serve import stop_bound

from .conftest import LiveServer, make_config

pytestmark = pytest.mark.slow

GRACE_S = 1.0
# The real server, run as `torchbay serve` runs it (cli._run: uvloop), with the stuck job.
SERVER = """
import asyncio, sys, threading
from torchbay.server.cli import _run
from torchbay.server.config.settings import ServerConfig
from torchbay.server.serve import TorchbayServer

config = ServerConfig.model_validate({
    "model_store": sys.argv[1], "shutdown_grace_s": float(sys.argv[2]),
    "inference_address": "http://127.0.0.1:0", "management_address": "http://127.0.0.1:0",
    "metrics_address": "http://127.0.0.1:0", "grpc_inference_port": 0, "grpc_management_port": 0,
})

class Server(TorchbayServer):
    async def startup(self):
        await super().startup()
        asyncio.get_running_loop().run_in_executor(None, threading.Event().wait)  # never returns
        print("stuck job in", flush=True)

_run(Server(config))
print("stopped", flush=True)
"""


def test_a_stuck_thread_job_does_not_hold_the_process_after_a_stop(tmp_path: Path) -> None:
    command = [sys.executable, "-c", SERVER, str(tmp_path), str(GRACE_S)]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "stuck job in\n"
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=stop_bound(GRACE_S) + 30)  # a loaded host's margin
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, out) == (0, "stopped\n")
    assert took < stop_bound(GRACE_S) + 30


def test_a_stuck_thread_job_does_not_hold_the_loops_close(tmp_path: Path) -> None:
    """The same with asyncio's own loop (asyncio.run in a thread, as LiveServer runs it)."""
    live = LiveServer(make_config(tmp_path, shutdown_grace_s=GRACE_S)).start()
    loop = live.server._loop
    assert loop is not None
    stuck = threading.Event()
    submitted = asyncio.run_coroutine_threadsafe(_submit(stuck), loop)
    try:
        assert submitted.result(timeout=30) is True
        live.stop()  # the server's thread joined: asyncio.run returned
    finally:
        stuck.set()


async def _submit(stuck: threading.Event) -> bool:
    asyncio.get_running_loop().run_in_executor(None, stuck.wait)
    return True
