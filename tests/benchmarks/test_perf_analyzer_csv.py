"""The pure parts of results/perf_analyzer/run.py: reading perf_analyzer's CSV, the medians over
runs, the report's table and the command line. Nothing here downloads or starts a server."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "results" / "perf_analyzer" / "run.py"

# perf_analyzer 2.40.0's -f output against torchbay (Triton's statistics extension: the server
# columns) and against KServe (none), as the script's runs wrote them; levels out of order.
TORCHBAY_CSV = """\
Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,\
Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,\
p90 latency,p95 latency,p99 latency
4,443.303,7,4022,4509,126,295,37,3,8362,13893,15168,19642
1,268.578,10,3077,30,127,420,43,4,3332,5273,7590,11684
"""
KSERVE_CSV = """\
Concurrency,Inferences/Second,Client Send,Client Recv,p50 latency,p90 latency,p95 latency,\
p99 latency
1,886.773,3,1,1111,1252,1324,1690
"""


@pytest.fixture(scope="module")
def run():
    spec = importlib.util.spec_from_file_location("perf_analyzer_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parse_csv_keeps_the_columns_each_server_reports(run) -> None:
    torchbay = run.parse_csv(TORCHBAY_CSV)
    assert [r["concurrency"] for r in torchbay] == [4, 1]
    assert torchbay[1]["infer_per_s"] == pytest.approx(268.578)
    assert torchbay[1]["p99_us"] == 11684
    assert torchbay[0]["server_queue_us"] == 4509
    assert torchbay[0]["server_compute_infer_us"] == 295
    (kserve,) = run.parse_csv(KSERVE_CSV)
    assert kserve["p50_us"] == 1111
    assert "server_queue_us" not in kserve


def test_medians_per_level_over_runs_and_only_levels_every_run_has(run) -> None:
    runs = [
        [{"concurrency": 1, "infer_per_s": 100.0, "p50_us": 10.0, "server_queue_us": 1.0}],
        [
            {"concurrency": 1, "infer_per_s": 300.0, "p50_us": 30.0},
            {"concurrency": 4, "infer_per_s": 999.0, "p50_us": 1.0},
        ],
        [{"concurrency": 1, "infer_per_s": 200.0, "p50_us": 50.0, "server_queue_us": 3.0}],
    ]
    (row,) = run.medians(runs)
    assert row["concurrency"] == 1 and row["runs"] == 3
    assert row["infer_per_s"] == 200.0
    assert row["p50_us"] == 30.0
    assert "server_queue_us" not in row  # one run lacks it: no median of two stands for three


def test_render_puts_both_systems_side_by_side_with_the_ratio(run) -> None:
    def rows(rate: float, p50: float) -> list[dict]:
        return [
            {"concurrency": 1, "runs": 3, "infer_per_s": rate, "p50_us": p50, "p99_us": 2 * p50}
        ]

    result = {
        "command": "python results/perf_analyzer/run.py --runs 3",
        "settings": "s",
        "host": "h",
        "medians": {
            "torchbay http": rows(300.0, 2000.0),
            "kserve http": rows(600.0, 1000.0),
            "torchbay grpc": rows(500.0, 1500.0),
            "kserve grpc": rows(400.0, 1200.0),
        },
    }
    text = run.render(result)
    assert "| http | 1 | 300 | 600 | 2.00 | 1.00 | 4.00 | 2.00 | 0.50 |" in text
    assert "| grpc | 1 | 500 | 400 | 1.50 | 1.20 | 3.00 | 2.40 | 1.25 |" in text
    assert "`python results/perf_analyzer/run.py --runs 3`" in text


def test_every_system_gets_the_same_window_and_one_level_per_run(run, tmp_path: Path) -> None:
    args = argparse.Namespace(window_ms=5000, max_trials=3, stability=1000)
    cmd = run.perf_command(Path("pa"), "127.0.0.1:1", "grpc", 4, args, tmp_path / "o.csv")
    assert cmd[cmd.index("--concurrency-range") + 1] == "4:4"
    assert cmd[cmd.index("--measurement-interval") + 1] == "5000"
    assert cmd[cmd.index("-i") + 1] == "grpc" and cmd[cmd.index("-f") + 1] == str(
        tmp_path / "o.csv"
    )
