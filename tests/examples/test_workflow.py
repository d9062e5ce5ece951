"""examples/workflow: two models chained in one request (shrink -> digits), served."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from .conftest import example_module

pytestmark = pytest.mark.slow


async def _post_all(url: str, bodies: list[bytes]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(client.post(url, content=b) for b in bodies))


def test_workflow_chains_shrink_into_digits(serve, tmp_path: Path) -> None:
    out = tmp_path / "out"
    mar = Path(example_module("workflow").build(out, epochs=8))
    entry = {"marName": "read_digit.mar", "batchSize": 4, "maxBatchDelay": 20}
    server = serve(mar.parent, models={"read_digit": {"1.0": entry}})
    url = f"{server.url}/predictions/read_digit"
    scans = [(out / f"scan_{d}.png").read_bytes() for d in range(10)]
    wrong_size = (out / "sample_3.png").read_bytes()  # the 8x8 image the second node reads
    replies = asyncio.run(_post_all(url, [*scans, wrong_size, b"not a png"]))
    answered = replies[:10]
    assert all(r.status_code == 200 for r in answered), [r.text for r in answered]
    assert all(r.headers["x-workflow-node"] == "digits" for r in answered)
    tops = [max(r.json(), key=r.json().get) for r in answered]
    assert sum(top == str(d) for d, top in enumerate(tops)) >= 9
    # A request the first node refuses gets that node's status and says which node it was.
    assert replies[10].status_code == 422 and replies[10].headers["x-workflow-node"] == "shrink"
    assert replies[10].json()["message"].startswith("shrink: the scan must be 32x32")
    assert replies[11].status_code == 400
