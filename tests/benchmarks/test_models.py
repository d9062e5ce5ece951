from __future__ import annotations

import pytest
import torch

from torchbay.benchmarks import models
from torchbay.benchmarks.errors import BenchError


def test_tiny_shape_and_params() -> None:
    model = models.build("tiny")
    assert not model.training
    assert sum(p.numel() for p in model.parameters()) == 64 * 256 + 256 + 256 * 10 + 10
    assert model(torch.zeros(3, 64)).shape == (3, 10)


def test_cnn_is_the_baseline_resnet() -> None:
    model = models.build("cnn")
    assert not model.training
    # baseline.md: "~309k parameters".
    assert sum(p.numel() for p in model.parameters()) == 308_650
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 10)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    # stem + 2 per block + 1x1 shortcuts on the two widening blocks.
    assert len(convs) == 1 + 3 * 2 + 2
    assert all(c.bias is None for c in convs)


def test_models_are_seeded() -> None:
    a, b = models.build("cnn"), models.build("cnn")
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize(("name", "size"), [("tiny", 256), ("cnn", 49_152)])
def test_sample_body_is_raw_float32(name: str, size: int) -> None:
    body = models.sample_body(name)
    assert len(body) == size
    assert body == models.sample_body(name)
    decoded = torch.frombuffer(bytearray(body), dtype=torch.float32)
    assert torch.equal(decoded.reshape(models.SAMPLE_SHAPES[name]), models.sample_tensor(name))


def test_scripted_model_matches_eager(tmp_path) -> None:
    eager = models.build("cnn")
    path = models.save_scripted(eager, tmp_path / "cnn.pt")
    scripted = torch.jit.load(str(path))
    x = models.sample_tensor("cnn")[None]
    with torch.inference_mode():
        assert torch.allclose(scripted(x), eager(x), atol=1e-5)


def test_unknown_model_is_a_bench_error() -> None:
    with pytest.raises(BenchError, match="unknown reference model"):
        models.build("resnet50")
