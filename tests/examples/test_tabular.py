"""examples/tabular: scikit-learn's iris MLP in torch, batched, served; answers match sklearn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from .conftest import example_module

pytestmark = pytest.mark.slow


async def _predict_all(url: str, rows: list) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        calls = [client.post(f"{url}/predictions/iris", json=row) for row in rows]
        return await asyncio.gather(*calls)


def test_tabular_served_in_batches_matches_sklearn(serve, tmp_path: Path) -> None:
    built = example_module("tabular").build(tmp_path / "out")
    server = serve(built.store, load_models=["iris.mar"])
    named = dict(
        zip(
            ["sepal length (cm)", "sepal width (cm)", "petal length (cm)", "petal width (cm)"],
            built.x_test[0].tolist(),
            strict=True,
        )
    )
    rows = [*built.x_test.tolist(), named, [1, 2, 3], {"sepal length (cm)": 1.0}, "nan"]
    replies = asyncio.run(_predict_all(server.url, rows))
    n = len(built.x_test)
    assert [r.status_code for r in replies] == [200] * (n + 1) + [400, 400, 400]
    bodies = [r.json() for r in replies[: n + 1]]
    torch_proba = np.array([[b["probabilities"][label] for label in built.labels] for b in bodies])
    # The torch model reproduces scikit-learn's probabilities (float32 vs float64).
    assert np.abs(torch_proba[:n] - built.sklearn_proba).max() < 1e-4
    assert np.allclose(torch_proba[n], torch_proba[0])  # named features, same row
    predicted = [built.labels.index(b["label"]) for b in bodies[:n]]
    assert (np.array(predicted) == built.y_test).mean() >= 0.9
    # model-config.yaml's batchSize 8 is the model's setting; no handler call took more than 8.
    described = httpx.get(f"{server.management_url}/models/iris", timeout=30).json()
    assert described[0]["batchSize"] == 8 and described[0]["maxBatchDelay"] == 20
    sizes = [int(r.headers["x-batch-size"]) for r in replies[: n + 1]]
    assert max(sizes) <= 8 and min(sizes) >= 1
    assert "missing features" in replies[n + 2].json()["message"]
