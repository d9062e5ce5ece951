"""One scenario description: the suites of ``torchbay bench scenario`` are built from the same
:class:`Scenario` rows as the reference scenarios, and every row becomes a valid load."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from torchbay.benchmarks import scenarios
from torchbay.benchmarks.bench import RunOptions
from torchbay.benchmarks.cli import build_archive
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import Target
from torchbay.benchmarks.scenarios import Scenario, Suite
from torchbay.benchmarks.sla import SlaOptions
from torchbay.cli import main


def test_suites_reuse_the_reference_scenarios() -> None:
    """The same measurement is described once: the cnn suite runs the reference cnn rows and the
    tiny suite starts with the baseline row, not copies of them."""
    reference = {s.name: s for s in scenarios.SCENARIOS}
    cnn = scenarios.find_suite("cnn")
    assert [r.name for r in cnn.runs] == ["tb-cnn-c1-b1-w1", "tb-cnn-c1-b8-w1", "tb-cnn-c10-b1-w2"]
    assert all(run is reference[run.name] for run in cnn.runs)
    assert scenarios.find_suite("tiny").runs[0] is reference["tb-tiny-c16-b8-w1"]
    every_row = [run.name for suite in scenarios.SUITES for run in suite.runs]
    assert len(every_row) == len(set(every_row)) == 8


@pytest.mark.parametrize("name", scenarios.suite_names())
def test_every_suite_row_becomes_run_options_and_its_sla_is_valid(
    name: str, tmp_path: Path
) -> None:
    suite = scenarios.find_suite(name)
    archive, inputs = tmp_path / "m.mar", [tmp_path / "body.bin"]
    for run in suite.runs:
        options = suite.run_options(run, archive, inputs, tmp_path / run.name)
        assert isinstance(options, RunOptions)
        assert (options.batch_size, options.workers) == (run.batch_size, run.workers)
        assert options.max_batch_delay_ms == run.max_batch_delay_ms
        assert (options.duration_s, options.warmup_s) == (suite.duration_s, suite.warmup_s)
        plan = options.plan(Target("127.0.0.1", 1, "/predictions/m", (b"x",)))
        if run.rate is None:
            assert (plan.mode, plan.concurrency) == ("closed", run.concurrency)
        else:
            assert (plan.mode, plan.rate, plan.arrival) == ("open", run.rate, run.arrival)
    sla = SlaOptions(archive=archive, inputs=tuple(inputs), **suite.sla)
    assert sla.sla_p99_ms > 0 and sla.batch_sizes


def test_durations_can_be_overridden(tmp_path: Path) -> None:
    suite = replace(scenarios.find_suite("digits"), duration_s=0.5, warmup_s=0.0)
    files = (tmp_path / "d.mar", [tmp_path / "x.png"], tmp_path)
    options = suite.run_options(suite.runs[1], *files)
    assert (options.duration_s, options.warmup_s, options.rate) == (0.5, 0.0, 200.0)


def test_a_scenario_has_exactly_one_load() -> None:
    with pytest.raises(ValueError, match="exactly one of concurrency"):
        Scenario("both", "torchbay", "tiny", 4, rate=10.0)
    with pytest.raises(ValueError, match="exactly one of concurrency"):
        Scenario("neither", "torchbay", "tiny", None)
    with pytest.raises(ValueError, match="exactly one of concurrency"):
        Scenario("zero", "torchbay", "tiny", 0)


def test_a_suite_runs_plain_torchbay_rows_of_one_model() -> None:
    (echo,) = scenarios.select(["echo-c16"])
    with pytest.raises(ValueError, match="not a plain torchbay run"):
        Suite("x", "", runs=(echo,))
    (nolog,) = scenarios.select(["tb-tiny-c16-b8-w1-nolog"])
    with pytest.raises(ValueError, match="not a plain torchbay run"):
        Suite("x", "", runs=(nolog,))
    (tiny,) = scenarios.select(["tb-tiny-c16-b8-w1"])
    (cnn,) = scenarios.select(["tb-cnn-c1-b1-w1"])
    with pytest.raises(ValueError, match="one model"):
        Suite("x", "", runs=(tiny, cnn))


def test_open_loop_rows_in_the_runner_and_the_report() -> None:
    row = scenarios.find_suite("tiny").runs[2]
    target = Target("127.0.0.1", 1, "/predictions/tiny", (b"x",))
    plan = row.plan(target, 3.0)
    assert (plan.mode, plan.rate, plan.arrival, plan.duration_s) == ("open", 2000.0, "poisson", 3.0)
    closed = scenarios.SCENARIOS[0].plan(target, 3.0)
    assert (closed.mode, closed.concurrency) == ("closed", 16)
    assert (row.name, row.setup) == ("tb-tiny-r2000-b8-w1", "r=2000 poisson b=8 d=5 w=1")
    assert scenarios.SCENARIOS[0].setup == "c=16"  # a ceiling has no batching


def test_an_unknown_suite_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BenchError, match="known: tiny, cnn, digits"):
        scenarios.find_suite("tinny")
    assert main(["bench", "scenario", "tinny"]) != 0
    err = capsys.readouterr().err
    assert "no scenario suite 'tinny'" in err and "Traceback" not in err


def _suite(tmp_path: Path, script: str | None) -> Suite:
    row = Scenario("tb-x-c1", "torchbay", "x", 1)
    script_path = None
    if script is not None:
        (tmp_path / "build.py").write_text(script)
        script_path = str(tmp_path / "build.py")
    return Suite(
        "x",
        "",
        runs=(row,),
        archive=str(tmp_path / "x.mar"),
        script=script_path,
        inputs=(str(tmp_path / "in.bin"),),
    )


def test_build_archive_runs_the_script_when_files_are_missing(tmp_path: Path) -> None:
    logged: list[str] = []
    make = f"""from pathlib import Path
Path({str(tmp_path / "x.mar")!r}).write_bytes(b"mar")
Path({str(tmp_path / "in.bin")!r}).write_bytes(b"body")
"""
    archive, inputs = build_archive(_suite(tmp_path, make), tmp_path, logged.append)
    assert archive.read_bytes() == b"mar" and [p.read_bytes() for p in inputs] == [b"body"]
    assert logged == [f"building with {tmp_path / 'build.py'}"]
    # Everything there now: the script is not run again.
    assert build_archive(_suite(tmp_path, "raise SystemExit(3)"), tmp_path, logged.append)
    assert len(logged) == 1


def test_build_archive_reports_a_failing_or_missing_script(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="no build script"):
        build_archive(_suite(tmp_path, None), tmp_path, print)
    failing = "import sys\nprint('boom: no data', file=sys.stderr)\nsys.exit(1)\n"
    with pytest.raises(BenchError, match="failed:\nboom: no data"):
        build_archive(_suite(tmp_path, failing), tmp_path, print)


def test_a_zero_duration_is_refused_not_replaced_by_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench scenario tiny --duration 0`` ran every scenario for the suite's own 10 s (a 0
    read as 'not given'); it is refused as ``bench run --duration 0`` is, before any server."""
    assert main(["bench", "scenario", "tiny", "--duration", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "duration_s: Input should be greater than 0" in err and "sent" not in err
