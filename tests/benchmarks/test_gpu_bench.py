"""scripts/gpu/bench.py runs here on its CPU fallback: in-process, and one variant served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.benchmarks.conftest import load_study

gpu_bench = load_study("scripts/gpu/bench.py")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CPU fallback")


def test_inprocess_fallback_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    row = gpu_bench.main(
        ["--models", "tiny,cnn", "--seconds", "0.1", "--batch", "2", "--json", str(out)]
    )
    # Without CUDA only the variants that have a CPU meaning run, each once per model.
    assert list(row.systems) == [
        f"{m} {v} in-process" for m in ("tiny", "cnn") for v in gpu_bench.CPU_VARIANTS
    ]
    for (metrics,) in row.systems.values():
        assert metrics["errors"] == 0 and metrics["samples_per_s"] > 0
        assert 0 < metrics["p50_ms"] <= metrics["p99_ms"]
        assert metrics["max_abs_diff"] < 1e-4  # every variant answers what the plain call does
    saved = json.loads(out.read_text())
    assert saved["device"].startswith("cpu") and saved["rows"]["gpu"]["systems"] == row.systems
    printed = capsys.readouterr().out
    assert "fallback" in printed and "| tiny plain in-process |" in printed


def test_served_variant_answers(tmp_path: Path) -> None:
    """``torchbay serve`` of a variant's archive (model-config's handler.torchbay) answers."""
    (metrics,) = gpu_bench.served("tiny", "eager", batch=2, seconds=0.3, concurrency=2).values()
    assert metrics["errors"] == 0 and metrics["samples_per_s"] > 0


def test_wide_model_and_bad_arguments() -> None:
    x = torch.randn(2, *gpu_bench.SHAPES["wide"])
    with torch.inference_mode():
        assert gpu_bench.build("wide")(x).shape == (2, 10)
    with pytest.raises(SystemExit):
        gpu_bench.parse_args(["--variants", "turbo"])
