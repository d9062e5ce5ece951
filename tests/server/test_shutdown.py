"""``torchbay serve`` as a real process: SIGTERM with requests in flight answers them all."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from torchbay.server.serving.handle import TERM_GRACE_S

from .cli_helpers import all_workers
from .conftest import ASSETS, LiveServer, build_store, load_gated_store, make_config, until

pytestmark = pytest.mark.slow


PROBE = (
    "models={\\\n"
    '  "probe": {"1.0": {"marName": "probe.mar", "minWorkers": 1, "batchSize": 4,\\\n'
    '                    "maxBatchDelay": 20}}\\\n'
    "}\n"
)


def _start(
    model_store: Path, tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, dict]:
    proc = _launch(model_store, tmp_path, PROBE + "shutdown_grace_s=20\n", env)
    ready = tmp_path / "ready.json"
    # The server writes the ready file once its listeners are up and its models loaded; the
    # process exiting first is a failure we report with its output.
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None:
            out = (tmp_path / "serve.log").read_text()
            pytest.fail(f"server exited early ({proc.returncode}):\n{out}")
        assert time.monotonic() < deadline, "server never became ready"
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


def _launch(
    model_store: Path, tmp_path: Path, properties: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """``torchbay serve`` over ``model_store`` with ``properties`` as its config.properties,
    its output in serve.log, its ready file ready.json (in ``tmp_path``)."""
    ready = tmp_path / "ready.json"
    config = tmp_path / "config.properties"
    config.write_text(properties)
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "torchbay", "serve",
            "--model-store", str(model_store), "--ts-config", str(config), "--ncs",
            "--disable-token-auth", "--ready-file", str(ready),
            "--inference-address", "http://127.0.0.1:0",
            "--management-address", "http://127.0.0.1:0",
            "--metrics-address", "http://127.0.0.1:0",
        ],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()  # the child holds its own descriptor
    return proc


async def _admitted(client: httpx.AsyncClient, info: dict) -> int:
    """How many requests the probe model has admitted (describe, on the ready file's port)."""
    url = f"http://127.0.0.1:{info['management']}/models/probe"
    return (await client.get(url)).json()[0]["metrics"]["requests"]


def _sigterm_during(
    proc: subprocess.Popen, info: dict, *, sleep: float, n: int = 6, **extra: object
) -> tuple[list[httpx.Response], int, float]:
    """Send ``n`` requests whose batches take ``sleep`` s (``extra``: more of the probe's keys),
    SIGTERM the server once all are admitted (one batch running, the rest queued), and return
    the answers, the exit code and the seconds from the SIGTERM to the exit."""
    url = f"http://127.0.0.1:{info['inference']}/predictions/probe"
    sent: list[float] = []

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            tasks = [
                asyncio.ensure_future(client.post(url, json={"sleep": sleep, "echo": i, **extra}))
                for i in range(n)
            ]
            # SIGTERM once the server has admitted all n (polled: on a loaded host they may
            # take a while to arrive), so none of them is refused as shutting down.
            while not any(t.done() for t in tasks) and await _admitted(client, info) < n:
                await asyncio.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            sent.append(time.monotonic())
            return await asyncio.gather(*tasks)

    try:
        responses = asyncio.run(scenario())
        code = proc.wait(timeout=60)
        return responses, code, time.monotonic() - sent[0]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_drains_in_flight_requests(model_store, tmp_path):
    proc, info = _start(model_store, tmp_path)
    workers = [c.pid for c in all_workers(proc.pid)]
    assert workers, "no worker process found"

    # The frontend never loads torch: no libtorch mapped in the serving process, while its
    # workers have it.
    def maps_torch(pid: int) -> bool:
        return any("libtorch" in m.path for m in psutil.Process(pid).memory_maps())

    assert not maps_torch(proc.pid)
    assert all(maps_torch(pid) for pid in workers)

    responses, code, _ = _sigterm_during(proc, info, sleep=1.0)
    assert [r.status_code for r in responses] == [200] * 6
    assert sorted(r.json()["echo"] for r in responses) == list(range(6))
    assert code == 0
    for pid in workers:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_sigterm_answers_503_for_work_past_the_grace_period(model_store, tmp_path):
    # TORCHBAY_* settings override config.properties: a 1 s grace, then 503 for what is left.
    proc, info = _start(model_store, tmp_path, env={"TORCHBAY_SHUTDOWN_GRACE_S": "1"})

    responses, code, _ = _sigterm_during(proc, info, sleep=3.0)
    codes = [r.status_code for r in responses]
    # Every request got exactly one answer: nothing hung up on, the unfinished ones 503.
    assert set(codes) <= {200, 503} and 503 in codes
    assert all(r.json()["type"] == "ShuttingDown" for r in responses if r.status_code == 503)
    assert code == 0


@pytest.mark.parametrize("deaf", [False, True], ids=["sigterm-kills", "sigterm-ignored"])
def test_a_stuck_batch_holds_the_stop_for_the_grace_and_term_grace_only(
    model_store, tmp_path, deaf
):
    # A handler busy for 90 s (stuck in time.sleep or a C call; ``deaf``: with a SIGTERM
    # handler of its own, here one that ignores it): the drain answers its request 503 after
    # the 1 s grace, and its worker gets SIGTERM at once, SIGKILL TERM_GRACE_S later
    # (docs/shutdown.md). Was: a Shutdown it could not read and 10 s for it, then SIGTERM and
    # 10 s more, then SIGKILL: grace + 20 s, past Kubernetes' 30 s with KServe's 15 s grace.
    proc, info = _start(model_store, tmp_path, env={"TORCHBAY_SHUTDOWN_GRACE_S": "1"})
    workers = [c.pid for c in all_workers(proc.pid)]
    responses, code, took = _sigterm_during(proc, info, sleep=90.0, n=1, deaf=deaf)
    assert [r.status_code for r in responses] == [503]
    assert responses[0].json()["type"] == "ShuttingDown"
    assert code == 0
    # The grace, the stuck worker's TERM_GRACE_S, and closing the rest (~0.5 s on an idle
    # host; a loaded 2-core one: a few s).
    assert took < 1 + TERM_GRACE_S + 5, f"the stop took {took:.1f}s"
    for pid in workers:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_second_interrupt_stops_without_the_drain(model_store, tmp_path):
    # Ctrl-C twice ("second interrupt: stopping workers now"): the request still running is
    # answered 503 at once and the workers stop. Was: the full 20 s drain, then the batch.
    proc, info = _start(model_store, tmp_path)
    url = f"http://127.0.0.1:{info['inference']}/predictions/probe"
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, url, json={"sleep": 60}, timeout=90)
        until(lambda: asyncio.run(_admitted_now(info)) == 1, "the request's admission")
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert time.monotonic() - started < 10
        assert answer.result().status_code == 503
    assert code == 0


async def _admitted_now(info: dict) -> int:
    async with httpx.AsyncClient(timeout=30) as client:
        return await _admitted(client, info)


def test_log_format_json_covers_frontend_workers_and_access(model_store, tmp_path):
    proc, info = _start(model_store, tmp_path, env={"TORCHBAY_LOG_FORMAT": "json"})
    url = f"http://127.0.0.1:{info['inference']}/predictions/probe"
    try:
        assert httpx.post(url, json={"echo": 1}, timeout=60).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line for line in (tmp_path / "serve.log").read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    loggers = {r["logger"] for r in records}
    assert "torchbay.access" in loggers  # the frontend's access log
    assert any(name.startswith("torchbay.handlers") for name in loggers)  # a worker's record
    access = next(r for r in records if r["logger"] == "torchbay.access")
    assert access["status"] == 200 and access["model"] == "probe"


def test_sigterm_while_a_start_up_model_loads_stops_at_once(tmp_path_factory, tmp_path):
    # The model's load waits for a gate that never opens (60 s): the stop does not wait for it.
    store, started = load_gated_store(tmp_path_factory, tmp_path, "slow-start", "slow")
    models = 'models={"slow": {"1.0": {"marName": "slow.mar", "minWorkers": 1}}}\n'
    proc = _launch(store, tmp_path, models + "shutdown_grace_s=5\n")
    try:
        until(started.exists, "the start-up model's load", timeout=120.0)
        workers = [c.pid for c in all_workers(proc.pid)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # was: once the load had failed, 60 s later
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (tmp_path / "ready.json").exists()
    for pid in workers:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_stop_answers_the_registration_and_the_scale_that_wait_for_workers(
    tmp_path_factory, tmp_path
):
    gate = tmp_path / "gate"  # the workers' load waits for it; it opens only for a's first
    yaml = tmp_path / "gated.yaml"
    yaml.write_text(f"loadGate: {gate}\n")
    handler = str(ASSETS / "load_gate_handler.py")
    handlers, configs = {"a": handler, "b": handler}, {"a": yaml, "b": yaml}
    store = build_store(tmp_path_factory, "stop-gated", handlers, configs)
    live = LiveServer(make_config(store, enable_model_api=True, shutdown_grace_s=2)).start()
    mgmt, registry = live.management_url, live.server.registry
    gate.touch()
    register = f"{mgmt}/models?initial_workers=1&synchronous=true&url="
    assert httpx.post(register + "a.mar", timeout=120).status_code == 200
    gate.unlink()
    with ThreadPoolExecutor(2) as pool:
        scaling = pool.submit(
            httpx.put, f"{mgmt}/models/a?min_worker=2&synchronous=true", timeout=60
        )
        registering = pool.submit(httpx.post, register + "b.mar", timeout=60)

        def waiting() -> bool:
            b = registry.models.get("b", {}).get("1.0")
            return len(registry.resolve("a").slots) == 2 and b is not None and bool(b.slots)

        until(waiting, "both wait for a worker's load")
        live.stop()
        answers = [scaling.result(), registering.result()]
    for answer in answers:  # was: uvicorn's bare 500 once the grace (+5 s) had passed
        assert answer.status_code == 503, answer.text
        assert answer.json()["type"] == "ShuttingDown"


def test_a_stop_keeps_the_workers_last_output(model_store, tmp_path):
    # A worker that prints much at its exit (a handler's atexit hook): every line reaches the
    # console and model_log.log, formatted as the workers' output. Was: the console's fd was
    # closed before the log writer had written them all (a "Logging error" traceback, the
    # rest of the console's lines lost), and the start-up worker's last lines, forwarded after
    # the console was put back, went to it raw and never to model_log.log.
    lines = 20_000
    proc, _ = _start(model_store, tmp_path, env={"PROBE_EXIT_LINES": str(lines)})
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    console = (tmp_path / "serve.log").read_text()
    assert "Logging error" not in console
    for text in (console, (tmp_path / "logs" / "model_log.log").read_text()):
        said = [line for line in text.splitlines() if "probe exit line" in line]
        assert len(said) == lines
        assert all("torchbay.model_log: probe exit line" in line for line in said)
