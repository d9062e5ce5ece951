"""The SLA autopilot on a real server: a model whose service time grows with its batch, with
``slaP99Ms`` set, driven until the autopilot has decided; its metrics and describe show it, and
what it set stays within the configured maxima. No timing assertions: the target is far below
what a batch of 8 takes, so any window is over it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from torchbay.archiver.package import ArchiveOptions, package

from .conftest import LiveServer, make_config

SLOW = """
import time

def handle(data, context):
    if data is None:
        return None
    time.sleep(0.002 + 0.004 * len(data))  # service time grows with the batch
    return ["ok" for _ in data]
"""

MAX_BATCH, MAX_DELAY = 8, 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root, work = tmp_path_factory.mktemp("ap-store"), tmp_path_factory.mktemp("ap-build")
    (work / "slow.py").write_text(SLOW)
    package(
        ArchiveOptions(
            model_name="slow", version="1", export_path=root, handler=str(work / "slow.py")
        )
    )
    models = {
        "slow": {
            "1": {
                "marName": "slow.mar",
                "batchSize": MAX_BATCH,
                "maxBatchDelay": MAX_DELAY,
                "slaP99Ms": 5,
                "minWorkers": 1,
                "maxWorkers": 1,
            }
        }
    }
    config = make_config(root, load_models=["slow.mar"], models=models, enable_model_api=True)
    live = LiveServer(config).start()
    yield live
    live.stop()


async def _drive(url: str, stop: asyncio.Event) -> int:
    async with httpx.AsyncClient(timeout=30) as client:

        async def one() -> int:
            sent = 0
            while not stop.is_set():
                r = await client.post(f"{url}/predictions/slow", content=b"x")
                assert r.status_code == 200, r.text
                sent += 1
            return sent

        return sum(await asyncio.gather(*(one() for _ in range(8))))


async def _until_decided(live: LiveServer, deadline_s: float) -> dict:
    stop = asyncio.Event()
    driver = asyncio.create_task(_drive(live.url, stop))
    info: dict = {}
    deadline = time.monotonic() + deadline_s
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < deadline and not driver.done():
            r = await client.get(f"{live.management_url}/models/slow/1")
            info = r.json()[0]["autopilot"]
            if info["changes"]["down"] >= 2:
                break
            await asyncio.sleep(0.2)
    stop.set()
    assert await driver > 0
    return info


async def _driven_until(live: LiveServer, done: Callable[[], bool], deadline_s: float) -> None:
    stop = asyncio.Event()
    driver = asyncio.create_task(_drive(live.url, stop))
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and not driver.done() and not done():
        await asyncio.sleep(0.05)
    stop.set()
    assert await driver > 0


def test_the_autopilot_adapts_within_the_maxima_and_is_visible(server: LiveServer) -> None:
    info = asyncio.run(_until_decided(server, deadline_s=60))
    assert info["targetP99Ms"] == 5
    assert (info["maxBatchSize"], info["maxBatchDelayCeiling"]) == (MAX_BATCH, MAX_DELAY)
    assert info["changes"]["down"] >= 2, info  # over target: the delay, then more, came down
    assert 1 <= info["batchSize"] <= MAX_BATCH and 0 <= info["maxBatchDelay"] < MAX_DELAY
    assert info["windowP99Ms"] > 0
    # 8 closed-loop clients on one slow worker: requests arrive and the worker is busy
    assert info["arrivalRps"] > 0 and 0 < info["utilization"] <= 1.5, info
    described = httpx.get(f"{server.management_url}/models/slow/1").json()[0]
    assert described["batchSize"] == MAX_BATCH  # the configured ceiling is unchanged
    text = httpx.get(f"{server.metrics_url}/metrics").text
    labels = 'model="slow",version="1"'
    assert f"torchbay_autopilot_target_p99_ms{{{labels}}} 5.0" in text
    assert f"torchbay_autopilot_batch_size{{{labels}}}" in text
    assert f"torchbay_autopilot_max_batch_delay_ms{{{labels}}}" in text
    assert f"torchbay_autopilot_p99_ms{{{labels}}}" in text
    for series in ("arrival_rate", "utilization"):
        line = next(x for x in text.splitlines() if x.startswith(f"torchbay_autopilot_{series}{{"))
        assert labels in line and float(line.split()[-1]) > 0, line
    down = f'torchbay_autopilot_changes_total{{direction="down",{labels}}}'
    line = next((x for x in text.splitlines() if x.startswith(down)), "")
    assert line, [x for x in text.splitlines() if "autopilot_changes" in x]
    assert float(line.split()[-1]) >= 2
    for x in text.splitlines():
        if x.startswith("torchbay_autopilot_batch_size{"):
            assert 1 <= float(x.split()[-1]) <= MAX_BATCH


def test_the_management_api_sets_changes_and_clears_the_target_live(server: LiveServer) -> None:
    url = f"{server.management_url}/models/slow/1"

    def autopilot() -> dict | None:
        return httpx.get(url).json()[0]["autopilot"]

    def put(target: str) -> httpx.Response:
        return httpx.put(url, params={"sla_p99_ms": target, "synchronous": "true"})

    try:
        assert put("40").status_code == 200
        assert autopilot()["targetP99Ms"] == 40
        bad = put("-3")
        assert bad.status_code == 400 and "sla_p99_ms" in bad.text
        assert autopilot()["targetP99Ms"] == 40  # a refused change changes nothing
        assert put("0").status_code == 200
        assert autopilot() is None  # 0: off
    finally:
        put("5")


def test_switched_off_the_configured_batching_is_back_at_once(server: LiveServer) -> None:
    """Not after the next batch: with no traffic the queue kept the autopilot's values (the
    next batch ran with them while describe already said off)."""
    url = f"{server.management_url}/models/slow/1"
    mv = server.server.plane.registry.resolve("slow", "1")
    try:
        configured = (MAX_BATCH, MAX_DELAY / 1000)
        asyncio.run(
            _driven_until(
                server, lambda: (mv.queue.batch_size, mv.queue.max_delay_s) != configured, 60
            )
        )
        assert (mv.queue.batch_size, mv.queue.max_delay_s) != configured  # the autopilot moved
        assert httpx.put(url, params={"sla_p99_ms": "0", "synchronous": "true"}).is_success
        assert (mv.queue.batch_size, mv.queue.max_delay_s) == configured
    finally:
        httpx.put(url, params={"sla_p99_ms": "5", "synchronous": "true"})


def test_a_delay_whose_seconds_read_back_above_it_keeps_the_model_serving(
    server: LiveServer,
) -> None:
    """3.97 ms is 0.00397 s in the queue, which reads back 3.9700000000000006 ms: above its own
    ceiling, so the first window that held 'clipped' the delay and counted a 'hold' change
    (KeyError), which ended the slot's dispatcher: every later request hung."""
    mgmt = server.management_url
    params = {"url": "slow.mar", "model_name": "odd", "batch_size": "4", "synchronous": "true"}
    params |= {"max_batch_delay": "3.97", "sla_p99_ms": "1000", "initial_workers": "1"}
    assert httpx.post(f"{mgmt}/models", params=params, timeout=120).status_code == 200
    try:
        with httpx.Client(timeout=10) as client:
            end = time.monotonic() + 3  # past the first windows (1 s, 20 requests)
            while time.monotonic() < end:
                answer = client.post(f"{server.url}/predictions/odd", content=b"x")
                assert answer.status_code == 200, answer.text
            info = client.get(f"{mgmt}/models/odd").json()[0]["autopilot"]
        assert info["windowP99Ms"] is not None, info  # a window closed and was decided
        assert info["maxBatchDelay"] <= info["maxBatchDelayCeiling"] == 3.97, info
        assert info["changes"] == {"up": 0, "down": 0}, info  # 1 s target: nothing to change
    finally:
        httpx.delete(f"{mgmt}/models/odd", timeout=60)
