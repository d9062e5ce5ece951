"""``python -m torchbay.benchmarks.tables round2`` against real servers with tiny durations: every
row runs, its counts add up and the report names every row. These check behaviour, never speed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from torchbay.benchmarks import round2_rows, tables

# A hang guard, not a speed bound: the TorchServe-beside test took 73 s and a batch sweep of
# four servers past 120 s with other suites beside it (load average 7.5).
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


def test_in_process_and_two_model_rows(tmp_path: Path) -> None:
    report, markdown = _run(tmp_path, "--only", "cnn-c16", "two-models", "--duration", "0.5")
    rows = report["rows"]
    assert set(rows) == {"cnn-c16", "two-models"}
    assert _positive(
        [rows["cnn-c16"]["systems"][s][0]["req_s"] for s in ("in-process", "torchbay")]
    )
    (two,) = rows["two-models"]["systems"]["torchbay"]
    assert _positive([two[k] for k in ("alone_a", "alone_b", "together_a", "together_b")])
    names = [r["name"] for r in rows["two-models"]["ratios"]]
    assert "combined together / alone" in names
    for row in rows.values():
        assert f"### {row['title']}" in markdown


def test_batch_sweep_pairs_batch_8_with_batch_1_at_every_concurrency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sweep's two ends: a server per concurrency either way, so two prove the pairing.
    monkeypatch.setattr(round2_rows, "SWEEP_CONCURRENCY", (2, 16))
    report, markdown = _run(tmp_path, "--only", "batch-sweep", "--duration", "0.5")
    row = report["rows"]["batch-sweep"]
    assert row["title"] == "cnn, batch 8 vs batch 1 at c=2..16"
    labels = {f"torchbay c={c} b{b}" for c in (2, 16) for b in (1, 8)}
    assert set(row["systems"]) == labels
    for label in labels:
        (run,) = row["systems"][label]
        assert run["req_s"] > 0 and run["errors"] == 0, (label, run)
    ratios = {r["name"]: r for r in row["ratios"]}
    assert set(ratios) == {f"torchbay c={c}: batch 8 / batch 1" for c in (2, 16)}
    for ratio in ratios.values():
        assert (ratio["bound"], ratio["aggregate"]) == (0.97, "min")
        (value,) = ratio["values"]
        assert math.isfinite(value) and value > 0
    assert f"### {row['title']}" in markdown


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
    report, markdown = _run(tmp_path, "--only", "start", "two-models", "--torchserve", str(TS_VENV))
    systems = report["rows"]["start"]["systems"]
    assert _positive([systems["torchserve"][0]["start_s"], systems["torchbay"][0]["start_s"]])
    assert "torchserve | start_s" in markdown
    two = report["rows"]["two-models"]
    assert "torchserve" not in two["not_run"]
    (ts,) = two["systems"]["torchserve"]
    assert _positive([ts[k] for k in ("alone_a", "alone_b", "together_a", "together_b")])
    bounds = {r["name"]: r["bound"] for r in two["ratios"]}
    assert bounds["combined together / alone"] == 0.90
    assert bounds["torchserve: combined together / alone"] is None
