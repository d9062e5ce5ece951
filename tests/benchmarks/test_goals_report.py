from __future__ import annotations

import json
import math

import pytest

from torchbay.benchmarks import report, scenarios
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.report import RowResult


def test_torchbay_models_json_is_torchserve_shaped() -> None:
    entry = scenarios.models_json({"cnn": scenarios.Batching(1, 10, 2)})
    assert entry == {
        "cnn": {
            "1.0": {
                "defaultVersion": True,
                "marName": "cnn.mar",
                "minWorkers": 2,
                "maxWorkers": 2,
                "batchSize": 1,
                "maxBatchDelay": 10,
            }
        }
    }


# Goals as a table judges its systems: a ratio within each round, and a figure alone.
GOALS = (
    scenarios.Goal("a", "tiny vs echo", "tb-tiny", "req_per_s", 0.30, "echo-c16"),
    scenarios.Goal("b", "cnn batch 8 vs 1", "tb-cnn-b8", "req_per_s", 0.95, "tb-cnn-b1"),
    scenarios.Goal("c-p99", "cnn p99 (ms)", "tb-cnn-w2", "p99_ms", 60.0),
)


def _row(*runs: tuple[str, float, float]) -> RowResult:
    """A row of a run: (system, req/s, p99 ms) per round, NaN for a failed one."""
    row = RowResult("rows", "Rows", "load generator", wide=True)
    for name, rps, p99 in runs:
        row.add(name, {"req_per_s": rps, "p99_ms": p99, "requests": 100.0})
    return row


def test_goals_are_judged_round_by_round_and_a_failed_round_never_meets() -> None:
    row = _row(
        ("echo-c16", 30_000, 1.0),
        ("echo-c16", 34_000, 1.0),
        ("tb-tiny", 9_000, 5.0),
        ("tb-tiny", 11_000, 5.0),
        ("tb-cnn-w2", 300, 70.0),
    )
    goals = {g.key: g.ratio(row) for g in GOALS}
    assert goals["a"].values == pytest.approx([0.3, 11_000 / 34_000])
    assert goals["a"].met() is True and goals["a"].op == ">="
    assert goals["c-p99"].met() is False and goals["c-p99"].op == "<="
    assert goals["b"].values == [] and goals["b"].met() is False  # not measured: not met
    report.failed(row, "echo-c16", 3, BenchError("server exited with 1\nlog"), ("req_per_s",))
    row.add("tb-tiny", {"req_per_s": 12_000.0})
    assert GOALS[0].ratio(row).met() is False
    assert row.errors == ["repeat 3 echo-c16: server exited with 1"]


def test_markdown_fragment() -> None:
    row = _row(("echo-c16", 35_000, 1.5), ("torchserve-cnn", math.nan, math.nan))
    row.errors.append("repeat 1 torchserve-cnn: boom")
    header = {
        "title": "Round two",
        "when": "today",
        "settings": "echo-c16: c=16",
        "command": "python -m torchbay.benchmarks.tables round2 --repeat 1",
        "machine": "AMD EPYC, 2 cores",
    }
    text = report.render([row], header)
    assert text.startswith("## Round two\n")
    assert "`python -m torchbay.benchmarks.tables round2 --repeat 1`" in text
    assert "Machine: AMD EPYC, 2 cores" in text
    assert "| system | req_per_s | p99_ms | requests | req_per_s every repeat |" in text
    assert "| echo-c16 | 35,000 | 1.50 | 100 | 35,000 |" in text
    assert "| torchserve-cnn | n/a | n/a | 100 | n/a |" in text
    assert "Failures: repeat 1 torchserve-cnn: boom" in text
    json.dumps(report.as_json([row], header), allow_nan=True)


def test_wide_medians_skip_failed_rounds() -> None:
    loop = RowResult("inprocess", "Model in process", "", wide=True)
    loop.add("cnn", {"batch 1": 150.0, "batch 8": 140.0})
    loop.add("cnn", {"batch 1": 160.0, "batch 8": math.nan})
    loop.add("cnn", {"batch 1": 170.0, "batch 8": 146.0})
    lines = report.row_markdown(loop).splitlines()
    assert "| cnn | 160 | 143 | 150, 160, 170 |" in lines
