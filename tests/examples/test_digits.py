"""examples/digits: the quickstart's int8 archive, served; it reads the held-out sample digits."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from torchbay.archiver.package import ArchiveOptions, package

from .conftest import example_module

pytestmark = pytest.mark.slow


def test_digits_int8_served_reads_the_samples(serve, tmp_path: Path) -> None:
    out = tmp_path / "out"
    accuracy = example_module("digits", "train").train(out, epochs=8)
    assert accuracy > 0.9
    # The quickstart's archive: torch.export, int8-dynamic, with the parity check.
    package(
        ArchiveOptions(
            model_name="digits",
            version="1.0",
            model_file=out / "model.py",
            serialized_file=out / "digits.pt",
            handler="image_classifier",
            extra_files=(str(out / "index_to_name.json"),),
            config_file=out / "model-config.yaml",
            example_input=out / "example_input.pt",
            convert="export",
            precision="int8-dynamic",
            export_path=tmp_path / "store",
        )
    )
    server = serve(tmp_path / "store", load_models=["digits.mar"])
    correct = 0
    with httpx.Client(timeout=60) as client:
        for digit in range(10):
            body = (out / f"sample_{digit}.png").read_bytes()
            reply = client.post(f"{server.url}/predictions/digits", content=body)
            assert reply.status_code == 200, reply.text
            scores = reply.json()
            # topk: 3 from model-config.yaml, most likely first, probabilities
            assert len(scores) == 3 and list(scores.values()) == sorted(scores.values())[::-1]
            assert all(0 <= p <= 1 for p in scores.values()) and sum(scores.values()) <= 1.0001
            correct += max(scores, key=scores.get) == str(digit)
        assert client.post(f"{server.url}/predictions/digits", content=b"GIF89a").status_code == 400
    assert correct >= 9
