"""benchmarks/gpu_bench.py runs here on its CPU fallback: in-process, and one variant served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchbay.benchmarks import gpu_bench

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CPU fallback")


def test_inprocess_fallback_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    rows = gpu_bench.main(
        ["--models", "tiny,cnn", "--seconds", "0.1", "--batch", "2", "--json", str(out)]
    )
    # Without CUDA only the variants that have a CPU meaning run, each once per model.
    assert [(r.model, r.variant) for r in rows] == [
        (m, v) for m in ("tiny", "cnn") for v in gpu_bench.CPU_VARIANTS
    ]
    for row in rows:
        assert row.where == "in-process" and row.device == "cpu" and row.errors == 0
        assert row.samples_per_s > 0 and 0 < row.p50_ms <= row.p99_ms
        assert row.max_abs_diff < 1e-4  # every variant answers what the plain call does
    saved = json.loads(out.read_text())
    assert saved["device"].startswith("cpu") and len(saved["rows"]) == len(rows)
    assert "fallback" in capsys.readouterr().out


def test_served_variant_answers(tmp_path: Path) -> None:
    """``torchbay serve`` of a variant's archive (model-config's handler.torchbay) answers."""
    row = gpu_bench.served("tiny", "eager", batch=2, seconds=0.3, concurrency=2, device="cpu")
    assert row.where == "serve" and row.errors == 0 and row.samples_per_s > 0


def test_wide_model_and_bad_arguments() -> None:
    x = torch.randn(2, *gpu_bench.SHAPES["wide"])
    with torch.inference_mode():
        assert gpu_bench.build("wide")(x).shape == (2, 10)
    with pytest.raises(SystemExit):
        gpu_bench.parse_args(["--variants", "turbo"])
