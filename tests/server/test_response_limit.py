"""A response past ``max_response_size`` is that request's 500, answered by its worker: the
frontend never reads it (it read the whole body only to refuse it, so one big answer cost the
frontend, which serves every model, that much memory again, and a batch whose frame passed
2 GiB failed every request of it). The server runs as its own process, whose peak memory
(VmHWM) the test reads."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .cli_helpers import clean_env, free_addresses, kill_tree, read_ready
from .conftest import ASSETS, build_store

BIG = 200 << 20  # the handler's answer: far past the default max_response_size (6553500)
_MIB = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    store = build_store(tmp_path_factory, "limit", {"chaos": str(ASSETS / "chaos_handler.py")})
    cwd = tmp_path_factory.mktemp("limit-run")
    ready = cwd / "ready.json"
    args = [sys.executable, "-m", "torchbay", "serve", "--foreground", "--ncs"]
    args += [
        "--model-store",
        str(store),
        "--disable-token-auth",
        "--enable-model-api",
        "--ready-file",
        str(ready),
    ]
    env = clean_env(cwd / "tmp")
    with (cwd / "console.log").open("wb") as out:
        proc = subprocess.Popen(
            [*args, *free_addresses()], cwd=cwd, env=env, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 100
        while not ready.exists():
            assert proc.poll() is None, (cwd / "console.log").read_text()
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.05)
        info = read_ready(ready)
        register = "url=chaos.mar&batch_size=3&max_batch_delay=1000&initial_workers=1"
        management = f"http://127.0.0.1:{info['management']}/models?{register}&synchronous=true"
        reply = httpx.post(management, timeout=120)
        assert reply.status_code == 200, (reply.text, info)
        yield info
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=60)


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory in bytes (/proc's VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_response_past_the_limit_fails_alone_and_never_reaches_the_frontend(
    server: dict,
) -> None:
    url = f"http://127.0.0.1:{server['inference']}/predictions/chaos"
    before = _peak_rss(server["pid"])

    async def batch() -> list[httpx.Response]:  # one batch (batch_size 3, a 1 s delay)
        async with httpx.AsyncClient(timeout=120) as client:
            bodies = [{"big": BIG}, {}, {}]
            return list(await asyncio.gather(*(client.post(url, json=b) for b in bodies)))

    big, *mates = asyncio.run(batch())
    assert big.status_code == 500, big.text[:300]
    assert big.json()["type"] == "HandlerFailed" and "max_response_size" in big.text
    assert [r.status_code for r in mates] == [200, 200], [r.text[:300] for r in mates]
    grown = _peak_rss(server["pid"]) - before
    assert grown < 64 * _MIB, f"the frontend's peak memory grew {grown // _MIB} MiB"
