"""The ceiling server answers as the runner expects, in process and live under the generator;
the runner's one way to start a system under test."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from torchbay.benchmarks import echo_asgi, report, runner, scenarios
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, Target
from torchbay.benchmarks.report import RowResult


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


@pytest.mark.slow
def test_runner_measures_the_echo_server(
    tmp_path: Path, assets: runner.Assets, gen: LoadGenerator
) -> None:
    """A ceiling starts the way torchbay does (port 0, ready file) and is measured as round two
    measures every system: a warm-up, then one closed loop."""
    ctx = runner.Ctx(tmp_path, assets, gen, warmup_s=0.2, duration_s=1, repeat=1)
    with runner.serving(ctx, runner.ECHO, {"tiny": scenarios.Batching()}, tmp_path) as server:
        result = runner.closed(ctx, runner.target(ctx, server, "tiny", "tiny"), 4)
        assert server.first_answer("/predictions/tiny", b"x") > 0
    assert server.proc is not None and server.proc.returncode is not None  # stopped
    assert result.ok > 0 and result.errors == 0 and result.statuses == {"200": result.sent}
    assert result.latency.p50_ms <= result.latency.p90_ms <= result.latency.p99_ms


@pytest.mark.slow
def test_generator_counts_non_2xx(
    tmp_path: Path, tiny: tuple[Path, Path], gen: LoadGenerator
) -> None:
    """The generator counts every answer outside 2xx as an error (was: wrk's Lua hook)."""
    store = runner.Assets({}, {"tiny": tiny[1]}, model_store=tiny[0].parent)
    ctx = runner.Ctx(tmp_path, store, gen)
    with runner.serving(ctx, runner.TORCHBAY, {"tiny": scenarios.Batching()}, tmp_path) as server:
        assert server.endpoints is not None
        target = Target("127.0.0.1", server.endpoints.inference_port, "/predictions/nope", (b"x",))
        result = gen.run(LoadPlan(target, "closed", 2, duration_s=None, requests=50))
    assert result.sent == 50
    assert result.statuses == {"404": 50}
    assert result.errors == result.sent  # every answer was a 404


def test_unstartable_server_is_reported(
    tmp_path: Path, assets: runner.Assets, gen: LoadGenerator
) -> None:
    """A system that exits before it is ready fails its cell with the server's log, and the
    report still prints it (n/a)."""
    ctx = runner.Ctx(tmp_path, assets, gen, warmup_s=0, duration_s=1, repeat=1)
    ctx.python = str(tmp_path / "no-python")  # the ceiling's command cannot start
    (tmp_path / "no-python").write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    (tmp_path / "no-python").chmod(0o755)
    server = runner.make_system(ctx, runner.ECHO, {"tiny": scenarios.Batching()}, tmp_path)
    with pytest.raises(BenchError, match="server exited with 3") as failure:
        server.start()
    assert "broken" in str(failure.value)
    row = RowResult("tiny-c16", "t", "s", wide=True)
    report.failed(row, runner.ECHO, 1, failure.value, ("req_s",))
    assert row.errors[0].startswith("repeat 1 echo: server exited")
    assert "| echo | n/a |" in report.row_markdown(row)  # printable in the report


def test_one_way_to_describe_a_torchbay_system(
    tmp_path: Path, assets: runner.Assets, gen: LoadGenerator
) -> None:
    """The runner's torchbay command for a row's system: its batching in config.properties
    with the extra keys, its serve flags appended, and every listener on port 0 (built, not
    started)."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "tiny.mar").write_bytes(b"")  # looked for, not read: nothing starts
    store = runner.Assets(assets.pt, assets.body, model_store=tmp_path / "store")
    ctx = runner.Ctx(tmp_path, store, gen, start_timeout_s=7.0)
    run_dir = tmp_path / "run"
    served = {"tiny": scenarios.Batching(8, 5, 1)}
    flags = ("--no-access-log",)
    server = runner.make_system(
        ctx, "torchbay", served, run_dir, props={"job_queue_size": 50}, args=flags
    )
    lines = (run_dir / "config.properties").read_text().splitlines()
    assert json.loads(lines[0].removeprefix("models=")) == scenarios.models_json(served)
    assert lines[1:] == ["job_queue_size=50"]
    assert server.command[-1] == "--no-access-log" and server.start_timeout_s == 7.0
    assert server.command.count("http://127.0.0.1:0") == 3
    assert "tiny=tiny.mar" in server.command and server.proc is None
