"""examples/text: the built-in text_classifier with a vocabulary built in code, served."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from .conftest import example_module

pytestmark = pytest.mark.slow


async def _classify(url: str, held_out: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        # Half as JSON {"text": ...}, half as text/plain: both are the handler's input forms.
        calls = [
            client.post(url, json={"text": row["text"]})
            if i % 2
            else client.post(
                url, content=row["text"].encode(), headers={"content-type": "text/plain"}
            )
            for i, row in enumerate(held_out)
        ]
        return await asyncio.gather(*calls)


def test_text_classifier_served_accuracy_and_bad_text(serve, tmp_path: Path) -> None:
    out = tmp_path / "out"
    mar = Path(example_module("text").build(out))
    server = serve(
        mar.parent,
        models={"topics": {"1.0": {"marName": "topics.mar", "batchSize": 4, "maxBatchDelay": 20}}},
    )
    held_out = json.loads((out / "held_out.json").read_text())
    url = f"{server.url}/predictions/topics"
    replies = asyncio.run(_classify(url, held_out))
    assert all(r.status_code == 200 for r in replies)
    tops = [next(iter(r.json())) for r in replies]  # most likely label first
    correct = sum(top == row["label"] for top, row in zip(tops, held_out, strict=True))
    assert correct >= 0.9 * len(held_out)
    assert all(len(r.json()) == 3 for r in replies)  # topk: 3 from model-config.yaml
    with httpx.Client(timeout=60) as client:
        unknown = client.post(url, content=b"zzz qqq xxyy", headers={"content-type": "text/plain"})
        assert unknown.status_code == 200  # unknown words map to <unk>, still an answer
        empty = client.post(url, content=b"  ", headers={"content-type": "text/plain"})
        assert empty.status_code == 400 and "no tokens" in empty.json()["message"]
        latin1 = client.post(
            url, content=b"\xff\xfe", headers={"content-type": "application/octet-stream"}
        )
        assert latin1.status_code == 400
