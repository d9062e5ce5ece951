"""A console that nobody reads (stdout a pipe whose reader stalled) holds the workers' output in
their pipe, not in the frontend's memory: the thread that reads the workers' output stops while
the log writer is far behind, as TorchServe's reader blocks on its log. Before, 100 MB printed by
a handler grew the frontend by 155 MB, without bound. The server runs as its own process, whose
resident memory the test reads."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import httpx
import pytest

from .cli_helpers import clean_env, kill_tree, serve_foreground
from .conftest import ASSETS, build_store

pytestmark = pytest.mark.slow

PRINTED_MB = 80
_MIB = 1 << 20


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_stalled_console_holds_the_workers_output_back(tmp_path_factory) -> None:
    store = build_store(tmp_path_factory, "loud", {"chaos": str(ASSETS / "chaos_handler.py")})
    cwd = tmp_path_factory.mktemp("loud-run")
    args = ["--model-store", str(store), "--models", "chaos=chaos.mar", "--disable-token-auth"]
    env = clean_env(cwd / "tmp", LOG_LOCATION=str(cwd / "logs"))
    # stdout never read: the console stalls once the pipe is full
    proc, info = serve_foreground(args, cwd, env, stdout=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{info['inference']}/predictions/chaos"
        before = _rss(info["pid"])
        with contextlib.suppress(httpx.TimeoutException):  # the handler waits on its pipe
            httpx.post(url, json={"print_mb": PRINTED_MB}, timeout=8)
        grown = _rss(info["pid"]) - before
        assert grown < 40 * _MIB, f"the frontend holds {grown // _MIB} MiB more"
        health = httpx.get(f"http://127.0.0.1:{info['inference']}/ping", timeout=10)
        assert health.status_code == 200  # the event loop serves on
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=60)
        proc.stdout.close()
