"""round2's parts without a server: the overload arithmetic, the stepped open-loop schedule and
the TorchServe kind's command line and config.properties (no TorchServe needed)."""

from __future__ import annotations

import array
import json
import math
from functools import partial
from pathlib import Path

import pytest

from torchbay.benchmarks import managed, report, round2_overload, runner
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadPlan, Target
from torchbay.benchmarks.report import Eta, Ratio, RowResult
from torchbay.benchmarks.runner import TORCHBAY_ONLY_KEYS
from torchbay.benchmarks.scenarios import Batching, models_json
from torchbay.benchmarks.stats import stepped_offsets


def _timeline(rows: list[tuple[float, float, int]]) -> bytes:
    return array.array("d", [v for row in rows for v in row]).tobytes()


def test_stepped_offsets_follow_each_steps_rate() -> None:
    offsets = list(stepped_offsets(((1.0, 4.0), (1.0, 2.0))))
    assert offsets == [0.0, 0.25, 0.5, 0.75, 1.0, 1.5]
    # two processes at half the rate each, staggered, interleave to the same schedule
    halves = sorted(
        [*stepped_offsets(((1.0, 4.0),), 0.5, 0.0), *stepped_offsets(((1.0, 4.0),), 0.5, 0.5)]
    )
    assert halves == [0.0, 0.25, 0.5, 0.75]


def test_a_stepped_plan_must_name_its_highest_rate() -> None:
    tgt = Target("127.0.0.1", 1, "/", (b"x",))
    LoadPlan(tgt, "open", rate=8.0, steps=((1.0, 2.0), (1.0, 8.0)), duration_s=2.0).check()
    with pytest.raises(BenchError):
        LoadPlan(tgt, "open", rate=2.0, steps=((1.0, 2.0), (1.0, 8.0)), duration_s=2.0).check()
    with pytest.raises(BenchError):
        LoadPlan(tgt, "closed", rate=2.0, steps=((1.0, 2.0),), duration_s=1.0).check()


def test_overload_analysis_counts_phases_goodput_and_recovery() -> None:
    steps = ((2.0, 10.0), (2.0, 40.0), (4.0, 10.0))
    rows = [(0.1 * i, 0.010, 200) for i in range(20)]  # pre: 20 answers, p99 10 ms
    rows += [(2.0 + 0.05 * i, 0.5, 200) for i in range(30)]  # overload: 30 admitted, 500 ms
    rows += [(2.0 + 0.05 * i + 0.01, 0.001, 503) for i in range(10)]  # 10 rejected at once
    rows += [(3.9, 11.0, 200)]  # answered, but 11 s after its scheduled send: late
    rows += [(3.95, 0.2, -1)]  # a connection error
    rows += [(4.0 + 0.1 * i, 0.3, 200) for i in range(10)]  # recovery window 1: slow
    rows += [(5.0 + 0.1 * i, 0.015, 200) for i in range(30)]  # then normal again
    out = round2_overload.analyse(_timeline(rows), 20.0, steps, timeouts=3, sent=105)
    pre, overload, recovery = out["pre"], out["overload"], out["recovery"]
    assert (pre["answered"], overload["answered"], recovery["answered"]) == (20, 41, 40)
    assert pre["answered"] + overload["answered"] + recovery["answered"] + 1 + 3 == out["sent"]
    assert overload["rejected_503"] == 10 and overload["late"] == 1
    assert overload["admitted_p99_ms"] > 500
    # goodput counts 200s by answer time: the 30 overload answers arrive by 3.95 s (+ 0 pre)
    assert overload["goodput_per_s"] == pytest.approx(30 / 2.0)
    assert out["normal_p99_ms"] == pytest.approx(20.0)
    assert out["recovery_s"] == 1.0
    m = round2_overload.metrics(out)
    assert out["unanswered"] == 3 + 1  # timeouts and the connection error
    assert m["unanswered_10s"] == 3 + 1 + 1 and m["503_overload"] == 10
    assert m["goodput_ratio"] == pytest.approx(15.0 / 20.0)
    json.dumps(out)


def test_recovery_is_nan_when_latency_never_settles() -> None:
    assert math.isnan(round2_overload.recovery_seconds([5.0, 50.0], 10.0))
    assert round2_overload.recovery_seconds([50.0, 5.0, 50.0, 5.0, 6.0], 10.0) == 3.0
    assert round2_overload.recovery_seconds([5.0, 6.0], 10.0) == 0.0
    assert math.isnan(round2_overload.recovery_seconds([], 10.0))


def test_ratio_targets_use_the_named_aggregate() -> None:
    assert Ratio("b", [1.0, 0.95, 1.02], 0.97, ">=", "min").met() is False
    assert Ratio("b", [1.0, 0.95, 1.02], 0.97).met() is True  # the median is 1.0
    assert Ratio("u", [0.0, 2.0], 0, "<=", "max").met() is False
    assert Ratio("x", [1.0, math.nan], 0.5).met() is False  # a failed repeat never meets
    assert Ratio("info", [1.0]).met() is None


def test_torchserve_kind_command_line_and_properties(tmp_path: Path) -> None:
    venv = tmp_path / "ts-venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "torchserve"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert managed.find_torchserve(venv) == script.resolve()
    assert managed.find_torchserve(tmp_path / "nowhere") is None
    assert managed.find_torchserve(None) is None
    store = tmp_path / "store"
    store.mkdir()
    models = {"cnn": Batching(8, 10, 2)}
    server = managed.TorchServeServer.build(
        script,
        store,
        {"cnn": "cnn.mar"},
        tmp_path / "run",
        models_json(models),
        {"job_queue_size": 100},
    )
    cmd = server.command
    assert cmd[0] == str(script.resolve())
    for flag in ("--start", "--foreground", "--ncs", "--disable-token-auth", "--enable-model-api"):
        assert flag in cmd
    assert cmd[cmd.index("--model-store") + 1] == str(store.resolve())
    assert cmd[cmd.index("--models") + 1] == "cnn=cnn.mar"
    config = Path(cmd[cmd.index("--ts-config") + 1])
    props = dict(line.split("=", 1) for line in config.read_text().splitlines())
    assert server.endpoints is not None
    assert props["inference_address"] == f"http://127.0.0.1:{server.endpoints.inference_port}"
    assert props["management_address"].endswith(f":{server.endpoints.management_port}")
    assert props["metrics_mode"] == "prometheus" and props["job_queue_size"] == "100"
    grpc_ports = {int(props["grpc_inference_port"]), int(props["grpc_management_port"])}
    assert len(grpc_ports) == 2 and not grpc_ports & {7070, 7071}  # never another server's
    entry = json.loads(props["models"])["cnn"]["1.0"]
    assert (entry["batchSize"], entry["maxBatchDelay"], entry["minWorkers"]) == (8, 10, 2)
    assert entry["marName"] == "cnn.mar"
    assert not set(TORCHBAY_ONLY_KEYS) & set(props)


def test_row_markdown_shows_every_repeat_targets_and_not_run() -> None:
    row = RowResult("cnn-c1", "cnn, c=1, batch 8 vs batch 1", "c=1, delay 10 ms")
    row.add("torchbay b8", {"req_s": 150.0})
    row.add("torchbay b8", {"req_s": 160.0})
    row.not_run["torchserve"] = "not run (no --torchserve)"
    row.ratios.append(Ratio("torchbay: batch 8 / batch 1", [1.01, 0.96], 0.97, ">=", "min"))
    row.errors.append("repeat 2 torchbay b1: boom")
    text = report.row_markdown(row)
    assert "| torchbay b8 | req_s | 155 | 150, 160 |" in text
    assert "| torchserve | | not run (no --torchserve) | |" in text
    assert "| torchbay: batch 8 / batch 1 | 0.96 | 1.01, 0.96 | min >= 0.97 | MISSED |" in text
    assert "Failures: repeat 2 torchbay b1: boom" in text
    data = report.as_json([row], {"command": "c"})
    assert data["rows"]["cnn-c1"]["ratios"][0]["met"] is False
    json.dumps(data)


def test_round_two_progress_weighs_each_step_by_its_estimated_seconds() -> None:
    now, lines = [0.0], []
    eta = Eta(100.0, lines.append, lambda: now[0])
    now[0] = 10.0
    eta.tick("tiny-c16 repeat 1: torchbay", 25.0)  # a quarter of the estimate in 10 s
    now[0] = 40.0
    eta.tick("start repeat 1: torchbay", 25.0)  # slower than estimated: the pace follows
    assert lines == [
        "progress: 25/100 tiny-c16 repeat 1: torchbay; elapsed 10 s, about 30 s left",
        "progress: 50/100 start repeat 1: torchbay; elapsed 40 s, about 40 s left",
    ]


def test_a_report_is_written_with_its_command_and_fails_on_any_error(tmp_path: Path) -> None:
    row = RowResult("start", "start to first answer, tiny", "1 worker")
    row.add("torchbay", {"start_s": 0.9})
    head = report.header("tables", ["round2", "--only", "start"], "1 repeat(s)")
    assert head["command"] == "python -m torchbay.benchmarks.tables round2 --only start"
    assert json.loads(head["machine"])["cores"] >= 1
    printed: list[str] = []
    assert report.write([row], head, tmp_path, "round2", lambda s, **_: printed.append(s)) == 0
    markdown = (tmp_path / "round2.md").read_text()
    assert markdown == printed[0] and "| torchbay | start_s | 0.90 | 0.90 |" in markdown
    assert json.loads((tmp_path / "round2.json").read_text())["rows"]["start"]["systems"]
    row.errors.append("repeat 2 torchserve: not ready in 120 s")
    assert report.write([row], head, tmp_path / "again", "round2", lambda *a, **k: None) == 1


def test_one_loop_runs_repeat_outermost_and_a_failed_cell_is_nan_with_its_error(
    tmp_path: Path,
) -> None:
    """runner.run_rows: every round visits every row; a row with more rounds (the start row)
    runs on alone; a cell that raises leaves NaN for each of its labels and the others run."""
    calls: list[str] = []

    def ok(label: str, rnd: int) -> dict[str, dict[str, float]]:
        calls.append(f"{label}{rnd}")
        return {label: {"req_s": 10.0 * rnd}}

    def broken(rnd: int) -> dict[str, dict[str, float]]:
        calls.append(f"broken{rnd}")
        raise BenchError("server exited with 1\nlog tail")

    lines: list[str] = []
    ctx = runner.Ctx(
        tmp_path, runner.Assets({}, {}), None, repeat=2, log=lambda s, **_: lines.append(s)
    )  # type: ignore[arg-type]
    first = runner.Row(
        RowResult("one", "one", ""),
        [runner.Cell(("a",), partial(ok, "a"), 1.0), runner.Cell(("x", "y"), broken, 1.0)],
        ("req_s", "p99_ms"),
    )
    judged = lambda r: [Ratio("a", r.series("a", "req_s"))]  # noqa: E731
    second = runner.Row(
        RowResult("two", "two", ""),
        [runner.Cell(("b",), partial(ok, "b"))],
        ("req_s",),
        judge=judged,
        rounds=3,
    )
    one, two = runner.run_rows(ctx, [first, second])
    assert calls == ["a1", "broken1", "b1", "a2", "broken2", "b2", "b3"]
    assert one.series("a", "req_s") == [10.0, 20.0] and two.series("b", "req_s") == [10, 20, 30]
    assert (
        all(math.isnan(v) for v in one.series("y", "p99_ms")) and len(one.series("x", "req_s")) == 2
    )
    assert one.errors[0] == "repeat 1 x: server exited with 1" and len(one.errors) == 4
    assert two.ratios[0].values == [] and not one.ratios
    assert any("estimate" in line for line in lines) and "FAILED" in lines[2]
