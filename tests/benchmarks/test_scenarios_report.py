from __future__ import annotations

import json
import math

import pytest

from torchbay.benchmarks import report, scenarios
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.report import RowResult


def test_select_by_name_glob_server_and_tag() -> None:
    names = lambda chosen: [s.name for s in chosen]  # noqa: E731
    assert names(scenarios.select(None)) == [s.name for s in scenarios.SCENARIOS]
    assert names(scenarios.select(["echo-c16"])) == ["echo-c16"]
    assert names(scenarios.select(["naive*"])) == ["naive-tiny-c16", "naive-cnn-c10"]
    assert names(scenarios.select(["b"])) == ["tb-cnn-c1-b1-w1", "tb-cnn-c1-b8-w1"]
    assert len(scenarios.select(["torchbay"])) == 5
    with pytest.raises(BenchError, match="no scenario matches"):
        scenarios.select(["ehco"])


def test_every_target_names_known_scenarios() -> None:
    known = {s.name for s in scenarios.SCENARIOS}
    for target in scenarios.TARGETS:
        assert target.numerator in known
        assert target.denominator is None or target.denominator in known


def test_torchbay_models_json_is_torchserve_shaped() -> None:
    (scenario,) = scenarios.select(["tb-cnn-c10-b1-w2"])
    entry = scenarios.models_json({scenario.model: scenario.batching})
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


def _row(*runs: tuple[str, float, float]) -> RowResult:
    """The scenarios row of a run: (scenario, req/s, p99 ms) per round, NaN for a failed one."""
    row = RowResult("scenarios", "Reference scenarios", "load generator", wide=True)
    for name, rps, p99 in runs:
        row.add(name, {"req_per_s": rps, "p99_ms": p99, "requests": 100.0})
    return row


def test_goals_are_judged_round_by_round_and_a_failed_round_never_meets() -> None:
    row = _row(
        ("echo-c16", 30_000, 1.0),
        ("echo-c16", 34_000, 1.0),
        ("tb-tiny-c16-b8-w1", 9_000, 5.0),
        ("tb-tiny-c16-b8-w1", 11_000, 5.0),
        ("tb-cnn-c10-b1-w2", 300, 70.0),
    )
    goals = {g.key: g.ratio(row) for g in scenarios.TARGETS}
    assert goals["a"].values == pytest.approx([0.3, 11_000 / 34_000])
    assert goals["a"].met() is True and goals["a"].op == ">="
    assert goals["c-p99"].met() is False and goals["c-p99"].op == "<="
    assert goals["b"].values == [] and goals["b"].met() is False  # not measured: not met
    report.failed(row, "echo-c16", 3, BenchError("server exited with 1\nlog"), ("req_per_s",))
    row.add("tb-tiny-c16-b8-w1", {"req_per_s": 12_000.0})
    assert next(g for g in scenarios.TARGETS if g.key == "a").ratio(row).met() is False
    assert row.errors == ["repeat 3 echo-c16: server exited with 1"]


def test_markdown_fragment() -> None:
    row = _row(("echo-c16", 35_000, 1.5), ("naive-cnn-c10", math.nan, math.nan))
    row.errors.append("repeat 1 naive-cnn-c10: boom")
    header = {
        "title": "Reference scenarios",
        "when": "today",
        "settings": "echo-c16: c=16",
        "command": "python -m torchbay.benchmarks.tables reference --quick",
        "machine": "AMD EPYC, 2 cores",
    }
    text = report.render([row], header)
    assert text.startswith("## Reference scenarios\n")
    assert "`python -m torchbay.benchmarks.tables reference --quick`" in text
    assert "Machine: AMD EPYC, 2 cores" in text
    assert "| system | req_per_s | p99_ms | requests | req_per_s every repeat |" in text
    assert "| echo-c16 | 35,000 | 1.50 | 100 | 35,000 |" in text
    assert "| naive-cnn-c10 | n/a | n/a | 100 | n/a |" in text
    assert "Failures: repeat 1 naive-cnn-c10: boom" in text
    json.dumps(report.as_json([row], header), allow_nan=True)


def test_wide_medians_skip_failed_rounds() -> None:
    loop = RowResult("inprocess", "Model in process", "", wide=True)
    loop.add("cnn", {"batch 1": 150.0, "batch 8": 140.0})
    loop.add("cnn", {"batch 1": 160.0, "batch 8": math.nan})
    loop.add("cnn", {"batch 1": 170.0, "batch 8": 146.0})
    lines = report.row_markdown(loop).splitlines()
    assert "| cnn | 160 | 143 | 150, 160, 170 |" in lines


def test_reference_table_plan() -> None:
    from torchbay.benchmarks.tables import plan

    everything, loop = plan([])
    assert len(everything) == len(scenarios.SCENARIOS) and loop
    chosen, loop = plan(["ceiling"])
    assert [s.server for s in chosen] == ["echo", "naive", "naive"] and loop
    chosen, loop = plan(["inprocess"])
    assert chosen == [] and loop
    chosen, loop = plan(["tb-tiny-c16-b8-w1,echo-c16"])
    assert [s.name for s in chosen] == ["echo-c16", "tb-tiny-c16-b8-w1"] and not loop
