"""Poisoned requests against a live server: each is sent concurrently with good requests that share
its batch; the good ones get the model's answers, the poison its own 4xx (or 500 for a handler
bug) with a clean JSON body, and after 100+ poisons the same worker still serves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from .conftest import ASSETS, _tiny_model, build_store

ROUNDS = 4  # rounds of every poison kind, POISONS_PER_ROUND of each per round
POISONS_PER_ROUND = 3
GOODS_PER_ROUND = 3
MODEL = {"batchSize": 8, "maxBatchDelay": 300, "minWorkers": 1, "maxWorkers": 1}
LEAKS = ("Traceback", 'File "', "/tmp", "/work", ".py")


@pytest.fixture(scope="module")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny.mar`` (the built-in tensor handler) and ``poison.mar`` (tests/server/assets/
    poison_handler.py), both over the seeded tiny model that ``expected`` rebuilds."""
    return build_store(
        tmp_path_factory,
        "poison-store",
        {"poison": str(ASSETS / "poison_handler.py"), "tiny": "tensor"},
    )


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> Callable[[list[float]], list[float]]:
    """The served model's output for one sample, computed in this process."""
    model = torch.jit.load(str(_tiny_model(tmp_path_factory.mktemp("ref") / "model.pt")))

    def run(x: list[float]) -> list[float]:
        with torch.no_grad():
            return model(torch.tensor([x])).tolist()[0]

    return run


def sample(k: int) -> list[float]:
    return [((i * 7 + k * 13) % 17) / 17 - 0.5 for i in range(64)]


def v2(data: Any, shape: list[int], datatype: Any = "FP32", **params: Any) -> bytes:
    request: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": data}]
    }
    if params:
        request["parameters"] = params
    return json.dumps(request).encode()


@dataclass(frozen=True)
class Poison:
    name: str
    path: str  # URL path
    body: bytes
    content_type: str
    status: int


JSON = "application/json"
X = sample(0)
POISONS = [
    Poison("deep-json", "/predictions/poison", b"[" * 100_000 + b"]" * 100_000, JSON, 400),
    Poison("v2-datatype-list", "/v2/models/tiny/infer", v2(X, [1, 64], ["FP32"]), JSON, 400),
    Poison("v2-wrong-shape", "/v2/models/tiny/infer", v2(X[:32], [1, 32]), JSON, 422),
    Poison("v2-wrong-dtype", "/v2/models/tiny/infer", v2([1] * 64, [1, 64], "INT64"), JSON, 422),
    Poison("not-utf8-json", "/predictions/poison", b'{"data": "\xff\xfe\x00"}', JSON, 400),
    Poison(
        "bad-multipart",
        "/predictions/poison",
        b'--xyz\r\nContent-Disposition: form-data; name="data"\r\n\r\nunterminated',
        "multipart/form-data; boundary=xyz",
        400,
    ),
    Poison(
        "raises", "/predictions/poison", json.dumps({"data": X, "poison": 1}).encode(), JSON, 500
    ),
    Poison(
        "crlf-header",
        "/predictions/poison",
        json.dumps({"data": X, "badheader": 1}).encode(),
        JSON,
        500,
    ),
    Poison(
        "status-99999",
        "/predictions/poison",
        json.dumps({"data": X, "badstatus": 1}).encode(),
        JSON,
        500,
    ),
    Poison(
        "nan-output", "/predictions/poison", json.dumps({"data": X, "nan": 1}).encode(), JSON, 200
    ),
]


def check_clean(poison: Poison, response: httpx.Response) -> Any:
    assert response.status_code == poison.status, (poison.name, response.text)
    for leak in LEAKS:
        assert leak not in response.text, (poison.name, response.text)
    assert "injected" not in {k.lower() for k in response.headers}, poison.name
    body = json.loads(response.text, parse_constant=lambda c: pytest.fail(f"bare {c}"))
    if poison.status == 200:
        assert body["output"] == [None, None, None], poison.name
    else:
        assert body["code"] == poison.status and body["message"], (poison.name, body)
        if poison.path.startswith("/v2"):
            assert body["error"] == body["message"], poison.name  # the OIP error field
    return body


async def good(client: httpx.AsyncClient, poison: Poison, k: int) -> tuple[Any, list[float]]:
    """A good request to the poison's model; returns (its output, the sample it sent)."""
    x = sample(k)
    if poison.path.startswith("/v2"):
        response = await client.post(
            poison.path, content=v2(x, [1, 64]), headers={"content-type": JSON}
        )
        assert response.status_code == 200, response.text
        [output] = response.json()["outputs"]
        return output["data"], x
    response = await client.post(poison.path, json={"data": x})
    assert response.status_code == 200, response.text
    return response.json(), x


async def one_round(client: httpx.AsyncClient, round_no: int) -> tuple[list[Any], list[Any]]:
    """Each poison's requests, then its good ones, all sent at once in that order: the good ones
    arrive beside the poisons (sent after every poison, on a fast host they arrived after them
    and never shared a batch with one)."""
    calls: list[tuple[Poison | None, Any]] = []
    for p_i, poison in enumerate(POISONS):
        for _ in range(POISONS_PER_ROUND):
            headers = {"content-type": poison.content_type}
            calls.append((poison, client.post(poison.path, content=poison.body, headers=headers)))
        for j in range(GOODS_PER_ROUND):
            calls.append((None, good(client, poison, round_no * 1000 + p_i * 10 + j)))
    sent = await asyncio.gather(*(c for _, c in calls))
    poisoned = [(p, r) for (p, _), r in zip(calls, sent, strict=True) if p is not None]
    return poisoned, [r for (p, _), r in zip(calls, sent, strict=True) if p is None]


def test_poisons_fail_alone_and_the_worker_survives(live_server, expected) -> None:
    server = live_server(
        models={
            "poison": {"1.0": {"marName": "poison.mar", "defaultVersion": True, **MODEL}},
            "tiny": {"1.0": {"marName": "tiny.mar", "defaultVersion": True, **MODEL}},
        }
    )
    pids = sorted(server.worker_pids())
    assert len(pids) == 2

    async def scenario() -> tuple[list[Any], list[Any]]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            poisoned, answered = [], []
            for round_no in range(ROUNDS):
                p, g = await one_round(client, round_no)
                poisoned += p
                answered += g
            return poisoned, answered

    poisoned, answered = asyncio.run(scenario())
    assert len(poisoned) >= 100
    for poison, response in poisoned:
        check_clean(poison, response)
    seen_first: list[int] = []
    bisected = 0
    for out, x in answered:
        want = expected(x)
        if isinstance(out, dict):  # predictions/poison: {"output": [...], "seen": [...]}
            assert out["output"] == pytest.approx(want, rel=1e-4, abs=1e-5)
            seen_first.append(out["seen"][0])
            bisected += len(out["seen"]) > 1
        else:
            assert out == pytest.approx(want, rel=1e-4, abs=1e-5)
    # Good requests really shared batches with poisons, and some were in a batch that a raising
    # poison failed, then bisected out of it and answered.
    assert max(seen_first) > 1 and bisected > 0, (seen_first, bisected)
    assert sorted(server.worker_pids()) == pids  # no worker died or was replaced
    last = httpx.post(f"{server.url}/predictions/poison", json={"data": X}, timeout=30)
    assert last.status_code == 200 and last.json()["output"] == pytest.approx(expected(X), rel=1e-4)
    status = httpx.get(f"{server.management_url}/models/poison", timeout=30).json()
    assert [w["status"] for w in status[0]["workers"]] == ["READY"]
