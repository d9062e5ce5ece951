"""The data path on a live server: batching, workers, devices, failures, shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import httpx
import pytest
import tritonclient.http as triton_http

from .conftest import batch_running, probe_models, until

pytestmark = pytest.mark.slow

GZIP_JSON = {"content-type": "application/json", "content-encoding": "gzip"}


async def _post_many(
    url: str, bodies: list[dict[str, Any] | bytes], stagger: float = 0.0
) -> list[httpx.Response]:
    """POST each of ``bodies`` to ``url`` concurrently: as JSON, bytes as gzipped JSON."""
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int, body: dict[str, Any] | bytes) -> httpx.Response:
            if stagger:
                await asyncio.sleep(stagger * i)
            if isinstance(body, bytes):
                return await client.post(url, content=body, headers=GZIP_JSON)
            return await client.post(url, json=body)

        return await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))


def test_predict_with_builtin_tensor_handler_and_oip(live_server):
    server = live_server(load_models=["tiny=tiny.mar"])
    body = bytes(256)  # 64 float32 zeros
    r = httpx.post(
        f"{server.url}/predictions/tiny",
        content=body,
        headers={"content-type": "application/octet-stream"},
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["output"]) == 10
    v2 = httpx.post(
        f"{server.url}/v2/models/tiny/infer",
        json={"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32", "data": [0.0] * 128}]},
    )
    assert v2.status_code == 200, v2.text
    out = v2.json()["outputs"][0]
    assert out["shape"] == [2, 10] and len(out["data"]) == 20
    assert httpx.get(f"{server.url}/v2/health/ready").json() == {"ready": True}
    assert httpx.get(f"{server.url}/v2/models/tiny/ready").status_code == 200
    meta = httpx.get(f"{server.url}/v2/models/tiny").json()
    assert meta["name"] == "tiny" and meta["versions"] == ["1.0"]
    assert httpx.get(f"{server.url}/ping").json() == {"status": "Healthy"}


def test_batches_form_under_concurrency(live_server):
    server = live_server(models=probe_models(batchSize=4, maxBatchDelay=2000))
    url = f"{server.url}/predictions/probe"
    # Five requests arrive within ~0.2 s; the first four leave together as one full batch as
    # soon as it is full (well before the 2 s delay), the fifth in a batch of its own.
    bodies = [{"echo": i} for i in range(5)]
    responses = asyncio.run(_post_many(url, bodies, stagger=0.05))
    assert [r.status_code for r in responses] == [200] * 5
    results = [r.json() for r in responses]
    assert [r["batch"] for r in results] == [4, 4, 4, 4, 1]
    assert [r["echo"] for r in results] == [0, 1, 2, 3, 4]
    assert len({r["pid"] for r in results}) == 1


def test_two_workers_both_serve(live_server):
    server = live_server(models=probe_models(minWorkers=2, maxWorkers=2, batchSize=1))
    bodies = [{"sleep": 0.3, "echo": i} for i in range(4)]
    responses = asyncio.run(_post_many(f"{server.url}/predictions/probe", bodies))
    assert all(r.status_code == 200 for r in responses)
    assert len({r.json()["pid"] for r in responses}) == 2
    assert sorted(server.worker_pids()) == sorted({r.json()["pid"] for r in responses})


def test_scaling_rebalances_cpu_threads(live_server):
    # Four (injected) cores: one worker takes all four; after scaling to two, each takes two,
    # the first one re-tuned live rather than left oversubscribing the CPU.
    server = live_server(cores=4, models=probe_models(batchSize=1))
    url = f"{server.url}/predictions/probe"
    assert httpx.post(url, json={}).json()["threads"] == 4
    scaled = httpx.put(
        f"{server.management_url}/models/probe",
        params={"min_worker": 2, "synchronous": "true"},
        timeout=60,
    )
    assert scaled.status_code == 200, scaled.text
    responses = asyncio.run(_post_many(url, [{"sleep": 0.3}] * 4))
    assert len({r.json()["pid"] for r in responses}) == 2
    assert {r.json()["threads"] for r in responses} == {2}


def test_gpu_ids_round_robin_across_models(live_server, model_store):
    # Two GPUs injected: workers of all models share one counter starting at GPU 0.
    server = live_server(
        gpu_count=2,
        models={
            "probe": {"1.0": {"marName": "probe.mar", "minWorkers": 2, "maxWorkers": 2}},
        },
        load_models=["probe2=probe.mar"],
    )
    registry = server.server.registry
    placements = sorted(
        slot.placement.gpu_id for mv in registry.all_versions() for slot in mv.slots
    )
    assert placements == [0, 0, 1]
    responses = asyncio.run(
        _post_many(f"{server.url}/predictions/probe", [{"sleep": 0.3}, {"sleep": 0.3}])
    )
    assert sorted(r.json()["gpu_id"] for r in responses) == [0, 1]


def test_one_bad_item_fails_only_its_request(live_server):
    server = live_server(models=probe_models(batchSize=3, maxBatchDelay=2000))
    url = f"{server.url}/predictions/probe"
    bodies = [{"sleep": 0.4}, {"echo": "a"}, {"bad": True}, {"echo": "c"}]
    responses = asyncio.run(_post_many(url, bodies, stagger=0.05))
    assert [r.status_code for r in responses] == [200, 200, 400, 200]
    assert responses[2].json()["type"] == "BadInput"
    assert responses[1].json()["batch_in"] == 3 and responses[1].json()["batch"] == 2


def test_a_request_refused_before_the_handler_is_not_in_its_batch_size(live_server):
    """Triton's batch_stats size is the batch the model ran: a request refused before the
    handler (here its gzip body does not inflate) is a failure, not in its batch's size."""
    server = live_server(models=probe_models(batchSize=3, maxBatchDelay=2000))
    bodies = [{"sleep": 0.4}, {"echo": "a"}, b"not gzip", {"echo": "c"}]
    responses = asyncio.run(_post_many(f"{server.url}/predictions/probe", bodies, stagger=0.05))
    assert [r.status_code for r in responses] == [200, 200, 400, 200]
    assert responses[1].json()["batch_in"] == 2
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        (entry,) = client.get_inference_statistics("probe")["model_stats"]
    finally:
        client.close()
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in entry["batch_stats"]}
    assert sizes == {1: 1, 2: 1} and entry["execution_count"] == 2


def test_killed_worker_answers_in_flight_and_comes_back(live_server):
    # One batch of the three requests, however slowly they arrive (a batch of 4 is never full).
    server = live_server(models=probe_models(batchSize=4, maxBatchDelay=1000))
    url = f"{server.url}/predictions/probe"
    [old_pid] = server.worker_pids()

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            tasks = [asyncio.ensure_future(client.post(url, json={"sleep": 5})) for _ in range(3)]
            # Kill once the worker runs the batch (polled: on a loaded host the requests may
            # take more than a second to reach it), never while they are still queued.
            while not any(t.done() for t in tasks) and not await asyncio.to_thread(
                batch_running, server, "probe"
            ):
                await asyncio.sleep(0.02)
            os.kill(old_pid, signal.SIGKILL)
            return await asyncio.gather(*tasks)

    responses = asyncio.run(scenario())
    assert [r.status_code for r in responses] == [503, 503, 503]
    assert all(r.json()["type"] == "WorkerDied" for r in responses)
    after = httpx.post(url, json={"echo": "back"}, timeout=60)
    assert after.status_code == 200
    assert after.json()["pid"] != old_pid


def test_queue_full_answers_503_with_retry_after(live_server):
    server = live_server(models=probe_models(batchSize=1, jobQueueSize=2))
    bodies = [{"sleep": 1.0}] + [{"echo": i} for i in range(5)]
    responses = asyncio.run(_post_many(f"{server.url}/predictions/probe", bodies, stagger=0.05))
    codes = [r.status_code for r in responses]
    assert codes.count(503) >= 1 and codes.count(200) >= 3
    rejected = [r for r in responses if r.status_code == 503]
    assert all(r.headers["retry-after"] == "1" for r in rejected)
    assert all(r.json()["type"] == "QueueFull" for r in rejected)


def test_stuck_handler_gives_504_and_worker_restarts(live_server):
    server = live_server(models=probe_models(responseTimeout=1))
    url = f"{server.url}/predictions/probe"
    [old_pid] = server.worker_pids()
    stuck = httpx.post(url, json={"sleep": 30}, timeout=60)
    assert stuck.status_code == 504
    after = httpx.post(url, json={"echo": 1}, timeout=60)
    assert after.status_code == 200 and after.json()["pid"] != old_pid


def test_request_past_its_deadline_is_answered_and_never_run(live_server):
    server = live_server(models=probe_models(clientTimeoutInMills=300))
    url = f"{server.url}/predictions/probe"
    responses = asyncio.run(
        _post_many(url, [{"sleep": 0.8, "echo": "first"}, {"echo": "late"}], stagger=0.05)
    )
    assert [r.status_code for r in responses] == [200, 504]
    ran = httpx.post(url, json={"ran": True}).json()["ran"]
    assert "first" in ran and "late" not in ran


def test_a_queued_request_is_answered_at_its_deadline_while_the_worker_is_busy(
    live_server, tmp_path
):
    """The one worker holds a batch until its gate opens; a request queued behind it with
    ``clientTimeoutInMills`` is answered 504 at its deadline, while the worker is still busy
    (it was answered only once the worker was free: up to ``response_timeout`` late), and
    never runs."""
    server = live_server(models=probe_models(clientTimeoutInMills=300, batchSize=1))
    url = f"{server.url}/predictions/probe"
    gate = tmp_path / "open"

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            held = asyncio.ensure_future(client.post(url, json={"until": str(gate)}))
            await asyncio.to_thread(until, lambda: batch_running(server, "probe"), "held runs")
            late = await client.post(url, json={"echo": "late"}, timeout=20)
            gate.touch()
            return await held, late

    held, late = asyncio.run(scenario())
    assert (held.status_code, late.status_code) == (200, 504)
    assert late.json()["type"] == "RequestTimeout"
    assert "late" not in httpx.post(url, json={"ran": True}, timeout=60).json()["ran"]


def test_a_grpc_deadline_ends_a_filling_batch_in_time(live_server):
    """A batch of 8 waits up to a minute for company; a gRPC call with a 3 s deadline joins
    it. The batch leaves in time for the call (half-way to its deadline) and both run; it left
    at the minute's end, past the call's DEADLINE_EXCEEDED."""
    import numpy as np
    import tritonclient.grpc as triton_grpc

    server = live_server(models=probe_models(batchSize=8, maxBatchDelay=60_000))
    port = server.server.state.ports.grpc_inference
    url = f"{server.url}/predictions/probe"

    def queued() -> bool:
        described = httpx.get(f"{server.management_url}/models/probe", timeout=30).json()[0]
        return described["jobQueueStatus"]["pendingRequests"] == 1

    async def scenario() -> tuple[httpx.Response, Any]:
        async with httpx.AsyncClient(timeout=120) as client:
            first = asyncio.ensure_future(client.post(url, json={"echo": "first"}))
            await asyncio.to_thread(until, queued, "the first request waits for company")
            body = triton_grpc.InferInput("body", [1], "BYTES")
            body.set_data_from_numpy(np.array([b'{"echo": "call"}'], dtype=object))
            grpc_client = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                call = await asyncio.to_thread(grpc_client.infer, "probe", [body], client_timeout=3)
            finally:
                grpc_client.close()
            return await first, call

    first, call = asyncio.run(scenario())
    assert first.status_code == 200 and first.json()["batch"] == 2
    (output,) = call.get_response(as_json=True)["outputs"]
    assert json.loads(call.as_numpy(output["name"])[0])["echo"] == "call"


def test_not_found_and_too_large(live_server):
    server = live_server(load_models=["tiny=tiny.mar"], max_request_size=1024)
    missing = httpx.post(f"{server.url}/predictions/nope", content=b"x")
    assert missing.status_code == 404 and missing.json()["type"] == "ModelNotFound"
    bad_version = httpx.post(f"{server.url}/predictions/tiny/9.9", content=b"x")
    assert bad_version.status_code == 404
    assert bad_version.json()["type"] == "ModelVersionNotFound"
    v2_missing = httpx.post(f"{server.url}/v2/models/nope/infer", json={"inputs": []})
    assert v2_missing.status_code == 404 and "error" in v2_missing.json()
    big = httpx.post(f"{server.url}/predictions/tiny", content=bytes(4096))
    assert big.status_code == 413 and big.json()["code"] == 413


def test_model_that_fails_to_load_leaves_others_serving(live_server, monkeypatch):
    monkeypatch.setenv("PROBE_FAIL_LOAD", "1")  # inherited by the probe's workers only
    server = live_server(load_models=["probe=probe.mar", "tiny=tiny.mar"])
    assert "probe" in server.server.state.failed_models
    assert "probe told to fail loading" in server.server.state.failed_models["probe"]
    ok = httpx.post(f"{server.url}/predictions/tiny", content=bytes(256))
    assert ok.status_code == 200
    assert httpx.post(f"{server.url}/predictions/probe", json={}).status_code == 404
