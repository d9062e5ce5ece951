"""``python -m torchbay.benchmarks.grpc_compare`` (benchmarks/grpc_compare.py): the medians table,
its flags, and a short run of every protocol pair against real servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchbay.benchmarks import grpc_compare
from torchbay.benchmarks.grpc_compare import Sample


def _sample(repeat: int, http: float, grpc_: float, p99: float) -> Sample:
    cell = {"model": "tiny", "pair": "modelinfer", "concurrency": 4, "repeat": repeat}
    http_side = {"ok_per_s": http, "p50_ms": 1.0, "p99_ms": p99, "sent": 5, "ok": 5 - repeat}
    grpc_side = {"ok_per_s": grpc_, "p50_ms": 2.0, "p99_ms": p99 * 2, "sent": 5, "ok": 5}
    sides = {f"http_{k}": v for k, v in http_side.items()}
    return {**cell, **sides, **{f"grpc_{k}": v for k, v in grpc_side.items()}}


def test_the_table_has_one_row_of_medians_per_cell() -> None:
    samples = [_sample(0, 100.0, 300.0, 5.0), _sample(1, 300.0, 100.0, 9.0),
               _sample(2, 200.0, 400.0, 7.0)]  # fmt: skip
    lines = grpc_compare.table(samples).splitlines()
    assert len(lines) == 3 and lines[1].count("|") == lines[0].count("|")
    row = [c.strip() for c in lines[2].strip("|").split("|")]
    assert row == ["tiny", grpc_compare.PAIRS["modelinfer"], "4", "3", "200.0", "300.0", "1.50",
                   "1.00 / 7.00", "2.00 / 14.00", "3"]  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [["--models", "huge"], ["--pairs", "rest"], ["-c", "0"], ["-c", "x"], ["--repeat", "0"]],
)
def test_bad_flags_exit_before_building_anything(argv: list[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        grpc_compare.main([*argv, "--out", str(tmp_path / "out")])
    assert info.value.code == 2 and not (tmp_path / "out").exists()


def test_a_short_run_measures_every_pair_on_real_servers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--models", "tiny", "--repeat", "1", "--duration", "0.3", "--warmup", "0",
            "-c", "2", "--out", str(tmp_path), "--json"]  # fmt: skip
    assert grpc_compare.main(argv) == 0
    out = capsys.readouterr().out
    table, _, dump = out.partition("\n[")
    rows = [line for line in table.splitlines() if line.startswith("| tiny |")]
    assert len(rows) == 3 and all(row.rstrip().endswith("| 0 |") for row in rows)
    samples = json.loads("[" + dump)
    assert sorted(s["pair"] for s in samples) == ["modelinfer", "predictions", "tensor"]
    for s in samples:  # every request answered 200 on both sides (no rate asserted)
        assert s["http_ok"] == s["http_sent"] and s["grpc_ok"] == s["grpc_sent"]
        assert s["http_sent"] + s["grpc_sent"] > 0


def test_a_failed_run_is_reported_and_the_others_still_run(tmp_path: Path) -> None:
    body = tmp_path / "x.bin"
    body.write_bytes(bytes(256))
    inputs = {"tiny": {"predictions": (tmp_path / "missing.mar", body),
                       "modelinfer": (tmp_path / "gone.mar", body)}}  # fmt: skip
    samples, failures = grpc_compare.compare(
        inputs, [1], repeat=1, duration_s=0.1, warmup_s=0.0, out=tmp_path, log=lambda _: None
    )
    assert samples == [] and len(failures) == 2
    assert "tiny predictions c=1 failed" in failures[0] and "missing.mar" in failures[0]
    assert "gone.mar" in failures[1]
