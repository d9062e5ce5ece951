"""``torchbay bench run --protocol grpc`` (benchmarks/grpc_pair.py): its closed loop against a
live server, the report beside HTTP's, and the flag offered to ``run`` only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from torchbay.benchmarks import bench, cli, grpc_pair
from torchbay.benchmarks.bench import BenchReport, RunOptions
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.managed import Endpoints


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_grpc_closed_loop_against_a_live_server(live_server) -> None:
    live = live_server(models={"tiny": {"1.0": {"marName": "tiny.mar", "defaultVersion": True}}})
    ports = live.server.state.ports
    endpoints = Endpoints("127.0.0.1", ports.grpc_inference, metrics_port=ports.metrics)
    method = f"/{grpc_pair.SERVICE}/Predictions"

    def run(model: str, body: bytes, seconds: float) -> BenchReport:
        messages = grpc_pair.predictions(model, None, (body,))
        target = grpc_pair.grpc_target(endpoints, ports.grpc_inference, method, messages)
        url = f"http://127.0.0.1:{ports.grpc_inference}"
        where = {"url": url, "model": model, "inputs": (Path("unused"),)}
        options = RunOptions(**where, concurrency=2, duration_s=seconds, warmup_s=0.1)
        return bench.measure(options, endpoints, model, None, target)

    report = run("tiny", bytes(256), 0.5)
    result = report.result
    assert report.url == f"grpc://127.0.0.1:{ports.grpc_inference}{method}"
    assert report.server is not None  # /metrics scraped around the measured window
    assert result.sent > 0 and result.ok == result.sent == result.completed
    assert result.statuses == {"200": result.ok} and result.latency.count == result.ok
    failed = run("nope", b"{}", 0.2).result
    assert failed.ok == 0 and set(failed.statuses) == {"NOT_FOUND"}
    text = grpc_pair.format_side_by_side([report, report])
    assert "gRPC vs HTTP:" in text and report.url in grpc_pair.format_side_by_side([report])


def test_the_protocol_flag_is_offered_to_run_only(tmp_path: Path) -> None:
    args = _parse("run", "--url", "http://h:7070", "--model", "m", "-c", "2", "--input", "x",
                  "--protocol", "grpc")  # fmt: skip
    assert args.protocol == "grpc"
    with pytest.raises(SystemExit):
        _parse("sla", "--archive", "a", "--input", "x", "--sla-p99-ms", "1", "--protocol", "grpc")
    body = tmp_path / "x.json"
    body.write_text(json.dumps({}))
    options = cli._options(
        RunOptions,
        _parse("run", "--url", "http://h:7070", "--model", "m", "--rate", "5",
               "--input", str(body)),
    )  # fmt: skip
    with pytest.raises(BenchError, match="closed loop"):
        grpc_pair.run_grpc_bench(options)
