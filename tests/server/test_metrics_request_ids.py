"""A handler metric recorded for one request of a batch (TorchServe's ``idx`` argument, or a
cached metric's ``add_or_update(value, values, request_id)``) names that request alone in
model_metrics.log, as TorchServe's ``MetricCacheAbstract._get_req`` gives the backend's line
``self.request_ids[idx]``; a metric recorded without one names the whole batch
(``",".join(request_ids.values())``)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from .conftest import LiveServer, make_config, tiny_archive

HANDLER = """
from ts.torch_handler.base_handler import BaseHandler


class PerRequestHandler(BaseHandler):
    def handle(self, data, context):
        for i in range(len(data)):
            context.metrics.add_counter("PerRequest", 1, i)
        context.metrics.add_counter("PerBatch", 1)
        cached = context.metrics.add_metric_to_cache("Cached", "count", ["ModelName"])
        cached.add_or_update(1, ["ids"], "handler-own-id")
        return [{"rid": context.get_request_id(i), "batch": len(data)} for i in range(len(data))]
"""
_LINE = re.compile(r" - (\w+)\.\w+:[^|]*\|#[^|]*\|#hostname:[^,]*,requestID:(.*),timestamp:")


def test_a_metric_of_one_request_names_that_request_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "per_request.py").write_text(HANDLER)
    store = tmp_path / "store"
    store.mkdir()
    tiny_archive(tmp_path, store, "ids", str(tmp_path / "per_request.py"))
    monkeypatch.setenv("METRICS_LOCATION", str(tmp_path / "logs"))
    models = {"ids": {"1.0": {"marName": "ids.mar", "batchSize": 2, "maxBatchDelay": 20000}}}
    config = make_config(
        store,
        models=models,
        metrics_mode="log",
        model_metrics_auto_detect=True,
        disable_system_metrics=True,
    )
    server = LiveServer(config).start()

    async def two() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            url = f"{server.url}/predictions/ids"
            return list(await asyncio.gather(*(client.post(url, json={}) for _ in range(2))))

    try:
        answers = asyncio.run(two())
    finally:
        server.stop()  # the metrics log's writer is flushed and closed
    assert [a.status_code for a in answers] == [200, 200]
    assert [a.json()["batch"] for a in answers] == [2, 2]  # one batch of both
    first, second = (a.json()["rid"] for a in answers)
    found = _LINE.findall((tmp_path / "logs" / "model_metrics.log").read_text())
    named = {name: sorted(rid for n, rid in found if n == name) for name, _ in found}
    assert sorted(named["PerRequest"]) == sorted([first, second])
    assert named["PerBatch"] in ([f"{first},{second}"], [f"{second},{first}"])
    assert named["Cached"] == ["handler-own-id"]
