"""``torchbay bench run --protocol grpc`` (benchmarks/grpc_load.py): its closed loop against a
live server, the report beside HTTP's, and the flag offered to ``run`` only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from torchbay.benchmarks import cli, grpc_load
from torchbay.benchmarks.bench import BenchReport, RunOptions
from torchbay.benchmarks.errors import BenchError


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_grpc_closed_loop_against_a_live_server(live_server) -> None:
    live = live_server(models={"tiny": {"1.0": {"marName": "tiny.mar", "defaultVersion": True}}})
    state = live.server.state
    target = grpc_load.GrpcTarget("127.0.0.1", state.ports.grpc_inference, "tiny", None, None,
                                  (bytes(256),), state.ports.metrics)  # fmt: skip
    scrapes = []
    result = grpc_load.run_grpc_load(target, 2, 0.5, 0.1, 10.0, on_warm=lambda: scrapes.append(1))
    assert scrapes == [1]
    assert result.sent > 0 and result.ok == result.sent == result.completed
    assert result.statuses == {"200": result.ok} and result.latency.count == result.ok
    missing = grpc_load.GrpcTarget("127.0.0.1", state.ports.grpc_inference, "nope", None, None,
                                   (b"{}",))  # fmt: skip
    failed = grpc_load.run_grpc_load(missing, 1, 0.2, 0.0, 10.0)
    assert failed.ok == 0 and set(failed.statuses) == {"NOT_FOUND"}
    text = grpc_load.format_side_by_side([BenchReport("probe", None, "u", {}, result, None)] * 2)
    assert "gRPC vs HTTP:" in text and target.url in grpc_load.format_side_by_side(
        [BenchReport("probe", None, target.url, {}, result, None)]
    )


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
        grpc_load.run_grpc_bench(options)
