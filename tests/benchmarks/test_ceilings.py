"""The ceiling servers answer as the runner expects, in process and live under the generator."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import torch

from torchbay.benchmarks import models, report, runner, scenarios
from torchbay.benchmarks.ceilings import echo_asgi, inprocess, naive_fastapi
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, Target
from torchbay.benchmarks.report import RowResult
from torchbay.benchmarks.scenarios import select


def _post(app: object, *paths_and_bodies: tuple[str, bytes]) -> list[httpx.Response]:
    """POST in process through httpx's ASGI transport (no server, no port)."""

    async def post() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return [await client.post(path, content=body) for path, body in paths_and_bodies]

    return asyncio.run(post())


def test_echo_app_answers_body_length() -> None:
    (response,) = _post(echo_asgi.app, ("/predictions/tiny", b"x" * 256))
    assert response.status_code == 200
    assert response.json() == {"ok": True, "bytes": 256}


def test_naive_fastapi_runs_the_model(assets: runner.Assets) -> None:
    threads = torch.get_num_threads()
    try:
        app = naive_fastapi.create_app("tiny", str(assets.pt["tiny"]))
    finally:
        torch.set_num_threads(threads)
    body = models.sample_body("tiny")
    ok, missing = _post(app, ("/predictions/tiny", body), ("/predictions/other", body))
    assert ok.status_code == 200
    assert set(ok.json()) == {"class", "score"}
    assert missing.status_code == 404


def test_inprocess_loop_reports_every_batch(assets: runner.Assets) -> None:
    threads = torch.get_num_threads()
    try:
        rates = inprocess.measure({"tiny": str(assets.pt["tiny"])}, (1, 4), 0.05)
    finally:
        torch.set_num_threads(threads)
    assert set(rates["tiny"]) == {1, 4}
    assert all(rate > 0 for rate in rates["tiny"].values())


@pytest.mark.slow
def test_runner_measures_the_echo_server(
    tmp_path: Path, assets: runner.Assets, gen: LoadGenerator
) -> None:
    ctx = runner.Ctx(tmp_path, assets, gen, warmup_s=0, duration_s=1, repeat=1)
    (scenario,) = select(["echo-c16"])
    result = runner.run_scenario(scenario, ctx, 1)
    assert result["requests"] > 0 and result["errors"] == 0
    assert result["cpu_ms_per_req"] > 0
    assert result["frontend_rss_mb"] > 0 and result["start_s"] > 0
    assert result["p50_ms"] <= result["p90_ms"] <= result["p99_ms"]
    assert result["foreign_cpu_pct"] >= 0


@pytest.mark.slow
def test_generator_counts_non_2xx(
    tmp_path: Path, assets: runner.Assets, gen: LoadGenerator
) -> None:
    """A ceiling starts the way torchbay does (port 0, ready file); the generator counts every
    answer outside 2xx as an error (was: wrk's Lua hook)."""
    (scenario,) = select(["naive-tiny-c16"])
    ctx = runner.Ctx(tmp_path, assets, gen)
    server = runner.make_system(ctx, scenario.server, {"tiny": scenario.batching}, tmp_path)
    try:
        endpoints = server.start()
        server.first_answer("/predictions/tiny", assets.body["tiny"].read_bytes(), 60)
        target = Target("127.0.0.1", endpoints.inference_port, "/predictions/nope", (b"x",))
        result = gen.run(LoadPlan(target, "closed", 2, duration_s=None, requests=50))
    finally:
        server.stop()
    assert server.proc is not None and server.proc.returncode is not None
    assert result.sent == 50
    assert result.statuses == {"404": 50}
    assert result.errors == result.sent  # every answer was a 404


def test_unstartable_server_is_reported(
    tmp_path: Path, assets: runner.Assets, gen: LoadGenerator
) -> None:
    (scenario,) = select(["echo-c16"])
    broken = replace(scenario, server="naive", model="tiny")
    bad_assets = runner.Assets(pt={"tiny": tmp_path / "missing.pt"}, body=assets.body)
    ctx = runner.Ctx(tmp_path, bad_assets, gen, warmup_s=0, duration_s=1, repeat=1)
    with pytest.raises(BenchError, match="server exited") as failure:
        runner.run_scenario(broken, ctx, 1)
    row = RowResult("scenarios", "t", "s", wide=True)
    report.failed(row, broken.name, 1, failure.value, ("req_per_s",))
    assert row.errors[0].startswith("repeat 1 echo-c16: server exited")
    assert "| echo-c16 | n/a | n/a |" in report.row_markdown(row)  # printable in the report


@pytest.mark.slow
def test_runner_measures_a_torchbay_scenario(
    tmp_path: Path, assets: runner.Assets, gen: LoadGenerator
) -> None:
    """The torchbay scenarios start through the same ManagedServer, with their batching from a
    config.properties entry for the same model (a regression: it was registered twice)."""
    tiny = runner.Assets(pt={"tiny": assets.pt["tiny"]}, body={"tiny": assets.body["tiny"]})
    archived = runner.archive_models(tiny, tmp_path, sys.executable)
    ctx = runner.Ctx(tmp_path, archived, gen, warmup_s=0, duration_s=1, repeat=1)
    (scenario,) = select(["tb-tiny-c16-b8-w1-nolog"])
    result = runner.run_scenario(scenario, ctx, 1)
    assert result["requests"] > 0 and result["errors"] == 0
    assert result["processes"] >= 2  # the frontend and its worker
    config = (tmp_path / "runs" / f"{scenario.name}-r1" / "config.properties").read_text()
    assert '"batchSize": 8' in config


def test_one_way_to_describe_a_torchbay_system(
    tmp_path: Path, assets: runner.Assets, gen: LoadGenerator
) -> None:
    """The runner's torchbay command for a scenario (round two's rows use the same one): the
    scenario's batching in config.properties with the extra keys, its serve flags appended, and
    every listener on port 0 (built, not started)."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "tiny.mar").write_bytes(b"")  # looked for, not read: nothing starts
    store = runner.Assets(assets.pt, assets.body, model_store=tmp_path / "store")
    ctx = runner.Ctx(tmp_path, store, gen, start_timeout_s=7.0)
    (scenario,) = select(["tb-tiny-c16-b8-w1-nolog"])
    run_dir = tmp_path / "run"
    served = {"tiny": scenario.batching}
    server = runner.make_system(
        ctx, "torchbay", served, run_dir, props={"job_queue_size": 50}, args=scenario.server_args
    )
    lines = (run_dir / "config.properties").read_text().splitlines()
    assert json.loads(lines[0].removeprefix("models=")) == scenarios.models_json(served)
    assert lines[1:] == ["job_queue_size=50"]
    assert server.command[-1] == "--no-access-log" and server.start_timeout_s == 7.0
    assert server.command.count("http://127.0.0.1:0") == 3
    assert "tiny=tiny.mar" in server.command and server.proc is None
