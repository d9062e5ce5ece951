"""TorchServe's micro-batching (``ts.handler_utils.micro_batching.MicroBatching``, its
``examples/micro_batching``) on a live server: a handler whose ``handle`` is a MicroBatching
answers every request of a batch with its own value, and a request that makes inference raise
fails alone (the worker bisects the batch). Before, the import failed and the model never loaded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from .conftest import ASSETS, LiveServer, _tiny_model, build_store, make_config

MODEL = {"batchSize": 8, "maxBatchDelay": 200, "minWorkers": 1, "maxWorkers": 1}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    handlers = {"mb": str(ASSETS / "micro_batching_handler.py")}
    store = build_store(tmp_path_factory, "micro-batching", handlers)
    models = {"mb": {"1.0": {"marName": "mb.mar", "defaultVersion": True, **MODEL}}}
    live = LiveServer(make_config(store, models=models)).start()
    yield live
    live.stop()


def _expected(value: float, work: Path) -> float:
    model = torch.jit.load(str(_tiny_model(work / "model.pt")))
    with torch.no_grad():
        return float(model(torch.full((1, 64), value))[0, 0])


async def _send(url: str, values: list[float]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        calls = [client.post(url, json={"value": v}) for v in values]
        return list(await asyncio.gather(*calls))


def test_every_request_of_a_micro_batched_batch_gets_its_own_answer(server, tmp_path) -> None:
    values = [float(v) for v in range(8)]
    answers = asyncio.run(_send(f"{server.url}/predictions/mb", values))
    assert [a.status_code for a in answers] == [200] * 8
    bodies = [a.json() for a in answers]
    assert [b["value"] for b in bodies] == values
    for body in bodies:
        assert body["out"] == pytest.approx(_expected(body["value"], tmp_path), abs=1e-5)
        assert body["micro_batch"] in range(4)  # micro-batches of 2 in a batch of at most 8


def test_a_request_that_makes_inference_raise_fails_alone(server) -> None:
    values = [1.0, 2.0, -1.0, 3.0]
    answers = asyncio.run(_send(f"{server.url}/predictions/mb", values))
    statuses = [a.status_code for a in answers]
    assert statuses[2] >= 400 and statuses[:2] + statuses[3:] == [200, 200, 200], statuses
    assert [a.json()["value"] for i, a in enumerate(answers) if i != 2] == [1.0, 2.0, 3.0]
    assert "Traceback" not in answers[2].text and "/" not in answers[2].json().get("message", "")
