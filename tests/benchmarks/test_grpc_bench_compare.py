"""``python -m torchbay.benchmarks.tables grpc`` (benchmarks/tables.py): the medians table,
its flags, and a short run of every protocol pair against real servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchbay.benchmarks import tables
from torchbay.benchmarks.report import RowResult, render
from torchbay.benchmarks.runner import Assets, Ctx, run_rows


def test_the_row_has_one_line_of_medians_per_cell() -> None:
    row = RowResult("grpc", "gRPC beside HTTP", "pairs", wide=True)
    name = tables.grpc_cell("tiny", "modelinfer", 4)
    for http, grpc_, p99 in ((100.0, 300.0, 5.0), (300.0, 100.0, 9.0), (200.0, 400.0, 7.0)):
        figures = {"http_ok_per_s": http, "http_p99_ms": p99, "grpc_ok_per_s": grpc_}
        row.add(name, {**figures, "not_200": 1.0})
    head = {"command": "c", "when": "w", "machine": "m", "settings": "s"}
    text = render([row], head)
    assert "| tiny modelinfer c=4 | 200 | 7.00 | 300 | 1.00 | 100, 300, 200 |" in text
    row.errors.append("repeat 4 tiny modelinfer c=4: boom")
    assert "Failures: repeat 4 tiny modelinfer c=4: boom" in render([row], head)


@pytest.mark.parametrize(
    "argv",
    [["--models", "huge"], ["--pairs", "rest"], ["-c", "0"], ["-c", "x"], ["--repeat", "0"]],
)
def test_bad_flags_exit_before_building_anything(argv: list[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        tables.main(["grpc", *argv, "--out", str(tmp_path / "out")])
    assert info.value.code == 2 and not (tmp_path / "out").exists()


def test_a_short_run_measures_every_pair_on_real_servers(tmp_path: Path) -> None:
    argv = [
        "grpc",
        "--models",
        "tiny",
        "--repeat",
        "1",
        "--duration",
        "0.3",
        "--warmup",
        "0",
        "-c",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert tables.main(argv) == 0
    table = (tmp_path / "grpc.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| tiny ")]
    ratios = [line for line in rows if ": gRPC / HTTP ok/s |" in line]
    assert len(rows) == 6 and len(ratios) == 3  # a line of medians and a ratio per pair
    systems = json.loads((tmp_path / "grpc.json").read_text())["rows"]["grpc"]["systems"]
    assert sorted(systems) == [f"tiny {p} c=2" for p in ("modelinfer", "predictions", "tensor")]
    for (run,) in systems.values():  # every request answered 200 on both sides (no rate asserted)
        assert run["not_200"] == 0 and run["http_ok_per_s"] > 0 and run["grpc_ok_per_s"] > 0


def test_a_failed_run_is_reported_and_the_others_still_run(tmp_path: Path) -> None:
    body = tmp_path / "x.bin"
    body.write_bytes(bytes(256))
    inputs = {
        "tiny": {
            "predictions": (tmp_path / "missing.mar", body),
            "modelinfer": (tmp_path / "gone.mar", body),
        }
    }
    ctx = Ctx(tmp_path, Assets({}, {}), None, 0.1, 0.0, 1, log=lambda *a, **k: None)  # type: ignore[arg-type]
    (row,) = run_rows(ctx, [tables.grpc_row(ctx, inputs, [1])])
    assert len(row.errors) == 2
    assert set(row.systems) == {"tiny predictions c=1", "tiny modelinfer c=1"}
    assert "repeat 1 tiny predictions c=1" in row.errors[0] and "missing.mar" in row.errors[0]
    assert "gone.mar" in row.errors[1]
