from __future__ import annotations

import math

import pytest

from torchbay.benchmarks import report, scenarios
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.runner import ScenarioResult


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


def _result(name: str, rnd: int, rps: float, **kw: float) -> ScenarioResult:
    return ScenarioResult(name, rnd, req_per_s=rps, p99_ms=kw.get("p99", 10.0), requests=100)


def test_medians_skip_failed_runs_and_targets_use_them() -> None:
    results = [
        _result("echo-c16", 1, 30_000),
        _result("echo-c16", 2, 34_000),
        _result("tb-tiny-c16-b8-w1", 1, 9_000),
        _result("tb-tiny-c16-b8-w1", 2, 11_000),
        ScenarioResult("tb-tiny-c16-b8-w1", 3, error="server exited with 1"),
        _result("tb-cnn-c10-b1-w2", 1, 300, p99=70.0),
    ]
    med = report.medians(results)
    assert med["echo-c16"]["req_per_s"] == 32_000
    assert med["tb-tiny-c16-b8-w1"]["req_per_s"] == 10_000
    assert med["tb-tiny-c16-b8-w1"]["runs"] == 2
    rows = {row[0]: row for row in report.target_rows(scenarios.TARGETS, med)}
    assert rows["a"][2:] == ["0.31x", ">= 0.3x", "met"]
    assert rows["c-p99"][-1] == "MISSED"
    assert rows["b"][-1] == "not measured"


def test_markdown_fragment() -> None:
    results = [_result("echo-c16", 1, 35_000), ScenarioResult("naive-cnn-c10", 1, error="boom\nx")]
    machine = {"cpu": "AMD EPYC", "cores": 2, "memory_gib": 24.0, "os": "Linux",
               "python": "3.11.7", "torch": "2.13.0+cpu", "torchbay": "0.1.0"}  # fmt: skip
    text = report.render_markdown(
        command="python -m torchbay.benchmarks.run_scenarios --quick",
        machine=machine,
        settings_line="load generator",
        scenarios=scenarios.select(["echo-c16", "naive-cnn-c10"]),
        results=results,
        targets=scenarios.TARGETS,
        inprocess={"tiny": {1: 50_000.0, 8: 305_000.0}},
        when="today",
    )
    assert "`python -m torchbay.benchmarks.run_scenarios --quick`" in text
    assert "AMD EPYC, 2 cores" in text
    assert "| echo-c16 | c=16 | 35,000 |" in text
    assert "naive-cnn-c10 round 1: boom (log: None)" in text
    assert "| tiny | 50,000 | 305,000 |" in text
    assert all(v is None or not (isinstance(v, float) and math.isnan(v))
               for run in report.results_json(results) for v in run.values())  # fmt: skip


def test_inprocess_medians() -> None:
    rounds = [{"cnn": {1: 150.0, 8: 140.0}}, {"cnn": {1: 160.0, 8: 146.0}}]
    assert report.inprocess_medians(rounds) == {"cnn": {1: 155.0, 8: 143.0}}


def test_run_scenarios_plan() -> None:
    from torchbay.benchmarks.run_scenarios import plan

    everything, loop = plan([])
    assert len(everything) == len(scenarios.SCENARIOS) and loop
    chosen, loop = plan(["ceiling"])
    assert [s.server for s in chosen] == ["echo", "naive", "naive"] and loop
    chosen, loop = plan(["inprocess"])
    assert chosen == [] and loop
    chosen, loop = plan(["tb-tiny-c16-b8-w1,echo-c16"])
    assert [s.name for s in chosen] == ["echo-c16", "tb-tiny-c16-b8-w1"] and not loop
