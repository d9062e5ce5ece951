"""``/metrics?name[]=`` as TorchServe 0.12 filters it: by sample name (a histogram's
``LatH_bucket``, ``LatH_count``, ``LatH_sum``; never its family name ``LatH``), only the matching
samples, and no family without one (its HELP and TYPE only come unfiltered). The same scrapes
(tests/data/torchserve/metrics_filter/record.py's QUERIES, after one prediction through
filter_handler.py with metrics.yaml there) run against a live torchbay and compared with what
TorchServe 0.12 answered (answers.json); torchbay's own families (``torchbay_*``) are left out.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import LiveServer, make_config, recorded, tiny_archive

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "metrics_filter"
record, RECORD = recorded(DATA, "record.py")


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Each query's page (record.page) from a torchbay that answered one prediction."""
    root = tmp_path_factory.mktemp("metrics-filter-store")
    work = tmp_path_factory.mktemp("metrics-filter-build")
    built = tiny_archive(work, work, "filter", str(DATA / "filter_handler.py"))
    shutil.move(built, root / "filter.mar")
    config = make_config(
        root,
        models={"filter": {"1.0": {"marName": "filter.mar"}}},
        metrics_config=DATA / "metrics.yaml",
        disable_system_metrics=True,
    )
    server = LiveServer(config).start()
    try:
        with httpx.Client(timeout=120) as client:
            answer = client.post(f"{server.url}/predictions/filter", content=b"x")
            assert answer.status_code == 200, answer.text
            found = {}
            for query in record.QUERIES:
                text = client.get(f"{server.metrics_url}/metrics{query}").text
                found[query] = _torchserve_families(record.page(text))
    finally:
        server.stop()
    yield found


def _torchserve_families(page: dict[str, Any]) -> dict[str, Any]:
    types = {k: v for k, v in page["types"].items() if not k.startswith("torchbay_")}
    samples = [s for s in page["samples"] if not s[0].startswith("torchbay_")]
    return {"types": types, "samples": samples}


def test_record_is_torchserve_0_12() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert RECORD["command"].endswith("tests/data/torchserve/metrics_filter/record.py")
    assert list(RECORD["pages"]) == list(record.QUERIES)


@pytest.mark.parametrize("query", record.QUERIES)
def test_same_families_and_samples(pages: dict[str, Any], query: str) -> None:
    assert pages[query] == RECORD["pages"][query]
