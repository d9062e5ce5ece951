"""``python -m torchbay.benchmarks.tables round2`` against real servers with tiny durations: every
row runs, its counts add up and the report names every row. These check behaviour, never speed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from torchbay.benchmarks import round2_rows, tables

# A hang guard, not a speed bound: the TorchServe-beside test took 73 s with other suites beside
# it (load average 7.5).
pytestmark = pytest.mark.timeout(300)
TS_VENV = Path("/work/ts-venv")
QUICK = ["--repeat", "1", "--duration", "1", "--warmup", "0.2", "--starts", "1"]


def _run(tmp_path: Path, *args: str) -> tuple[dict, str]:
    out, work = tmp_path / "out", tmp_path / "work"
    lines: list[str] = []
    code = tables.run(
        ["round2", *QUICK, "--out", str(out), "--work", str(work), *args],
        log=lambda *a, **k: lines.append(" ".join(map(str, a))),
    )
    report = json.loads((out / "round2.json").read_text())
    markdown = (out / "round2.md").read_text()
    assert code == 0, report
    assert any("estimate" in line for line in lines) and any("s left" in line for line in lines)
    return report, markdown


def _positive(values: list[float]) -> bool:
    return all(math.isfinite(v) and v > 0 for v in values)


def test_closed_loop_rows_and_start(tmp_path: Path) -> None:
    report, markdown = _run(tmp_path, "--only", "tiny-c16", "cnn-c1", "start")
    rows = report["rows"]
    assert set(rows) == {"tiny-c16", "cnn-c1", "start"}
    for key, systems in (
        ("tiny-c16", ("torchbay", "echo")),
        ("cnn-c1", ("torchbay b1", "torchbay b8")),
    ):
        for system in systems:
            (run,) = rows[key]["systems"][system]
            assert run["req_s"] > 0 and run["errors"] == 0, (key, system, run)
        assert rows[key]["not_run"]["torchserve"].startswith("not run")
    (start,) = rows["start"]["systems"]["torchbay"]
    assert 0 < start["start_s"] < 60
    targets = {r["name"]: r for key in rows for r in rows[key]["ratios"]}
    assert targets["torchbay: batch 8 / batch 1"]["aggregate"] == "min"
    assert targets["torchbay / bare ASGI"]["bound"] == 0.40
    for row in rows.values():
        assert f"### {row['title']}" in markdown
    assert "python -m torchbay.benchmarks.tables round2" in markdown


def test_rows_run_at_an_earlier_commit_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """The rows that ran up to commit 1adc89d (cnn-c16, two-models, batch-sweep) are not
    choices any more: the flag says which rows exist, before anything is built."""
    for retired in ("cnn-c16", "two-models", "batch-sweep"):
        with pytest.raises(SystemExit) as stop:
            tables.parse(["round2", "--only", retired])
        assert stop.value.code == 2
        assert "invalid choice" in capsys.readouterr().err
    assert list(round2_rows.ROWS) == ["tiny-c16", "cnn-c1", "overload", "start"]


def test_overload_row_counts_add_up(tmp_path: Path) -> None:
    report, markdown = _run(tmp_path, "--only", "overload", "--duration", "0.5")
    row = report["rows"]["overload"]
    (detail,) = row["extra"]["detail"]["torchbay"]
    phases = [detail[p] for p in ("pre", "overload", "recovery")]
    assert detail["sent"] > 0
    assert sum(p["answered"] for p in phases) + detail["unanswered"] == detail["sent"]
    for p in phases:
        assert p["ok"] + p["rejected_503"] + p["other_errors"] == p["answered"]
    (metrics,) = row["systems"]["torchbay"]
    assert metrics["capacity_req_s"] > 0
    assert metrics["offered_req_s"] == pytest.approx(4 * metrics["capacity_req_s"])
    # Where the CPU went (benchmarks/procstat.py): the workers ran in both windows.
    assert metrics["worker_ms_capacity"] > 0 and metrics["cpu_workers_4x_pct"] > 0
    assert metrics["cpu_frontend_4x_pct"] > 0 and metrics["cpu_loadgen_4x_pct"] > 0
    sweep = row["extra"]["sweep"]["torchbay"]
    assert [p["factor"] for p in sweep] == [0.5, 1.0, 2.0, 4.0]
    assert all(p["answered"] > 0 for p in sweep)
    assert (tmp_path / "out" / "round2_overload.png").stat().st_size > 1000
    assert f"### {row['title']}" in markdown and "round2_overload.png" in markdown


@pytest.mark.skipif(not (TS_VENV / "bin" / "torchserve").exists(), reason="no TorchServe here")
def test_torchserve_beside_torchbay_on_the_same_mar(tmp_path: Path) -> None:
    report, markdown = _run(tmp_path, "--only", "start", "cnn-c1", "--torchserve", str(TS_VENV))
    systems = report["rows"]["start"]["systems"]
    assert _positive([systems["torchserve"][0]["start_s"], systems["torchbay"][0]["start_s"]])
    assert "torchserve | start_s" in markdown
    paired = report["rows"]["cnn-c1"]
    assert "torchserve" not in paired["not_run"]
    for label in ("torchserve b1", "torchserve b8"):
        (run,) = paired["systems"][label]
        assert run["req_s"] > 0 and run["errors"] == 0, (label, run)
    bounds = {r["name"]: r["bound"] for r in paired["ratios"]}
    assert bounds["torchbay: batch 8 / batch 1"] == 0.97
    assert bounds["torchserve: batch 8 / batch 1"] is None
