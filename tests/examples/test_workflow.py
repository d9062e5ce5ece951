"""examples/workflow: a real .war (torch-workflow-archiver) of two model nodes and a function
node (shrink -> digits -> best), registered at start-up and answered on /wfpredict."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from .conftest import example_module, png_header

# Training, then three node workers on a shared host: past the default 120 s guard.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def _post_all(url: str, bodies: list[bytes]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(client.post(url, content=b) for b in bodies))


def test_workflow_reads_digits_through_its_dag(serve, tmp_path: Path) -> None:
    out = tmp_path / "out"
    war = Path(example_module("workflow").build(out, epochs=8))
    assert war.name == "read_digit.war" and war.is_file()
    server = serve(out / "model_store", workflow_store=war.parent, load_workflows=["all"])
    models = httpx.get(f"{server.management_url}/models", timeout=60).json()["models"]
    assert [m["modelName"] for m in models] == ["read_digit__digits", "read_digit__shrink"]
    shrink = httpx.get(f"{server.management_url}/models/read_digit__shrink", timeout=60).json()
    assert shrink[0]["batchSize"] == 4 and shrink[0]["maxBatchDelay"] == 20
    url = f"{server.url}/wfpredict/read_digit"
    scans = [(out / f"scan_{d}.png").read_bytes() for d in range(10)]
    wrong_size = (out / "sample_3.png").read_bytes()  # the 8x8 image the second node reads
    replies = asyncio.run(_post_all(url, [*scans, wrong_size]))
    answered = replies[:10]
    assert all(r.status_code == 200 for r in answered), [r.text for r in answered]
    assert all(set(r.json()) == {"digit", "probability", "top3"} for r in answered)
    assert sum(r.json()["digit"] == str(d) for d, r in enumerate(answered)) >= 9
    # A scan the first node refuses fails the workflow, which names the node (TorchServe's words).
    assert replies[10].status_code == 500
    assert replies[10].json()["message"] == "Error executing shrink"
    # A header past PIL's pixel limit is no scan (422 from the node), never a 500.
    node = f"{server.url}/predictions/read_digit__shrink"
    bomb = httpx.post(node, content=png_header(20_000, 20_000), timeout=120)
    assert bomb.status_code == 422, bomb.text
    # The README's curl -T uploads with PUT, which TorchServe answers as POST.
    put = httpx.put(url, content=scans[7], timeout=120)
    assert put.status_code == 200 and put.json()["digit"] == replies[7].json()["digit"]
