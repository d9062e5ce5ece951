"""Explanations (handlers/runtime/explain.py): the built-in image classifier answers Captum's
Integrated Gradients for ``explain: True`` requests, as TorchServe's VisionHandler; a bad target is
a 400 naming it; without Captum the answer is a 501 that says how to install it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from torchbay.handlers.runtime.service import load_service

from .conftest import body_json, req, write_manifest
from .test_classifiers import TinyCNN, png


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    """The image classifier of test_classifiers.py: a tiny CNN over 8x8 crops."""
    torch.manual_seed(0)
    torch.jit.script(TinyCNN().eval()).save(str(tmp_path / "cnn.pt"))
    (tmp_path / "model-config.yaml").write_text("image:\n  resize: 10\n  crop: 8\n")
    write_manifest(
        tmp_path, serialized="cnn.pt", handler="image_classifier", config_file="model-config.yaml"
    )
    return tmp_path


EXPLAIN = {"explain": "True"}


def test_integrated_gradients_per_image(image_dir: Path) -> None:
    pytest.importorskip("captum")
    service = load_service(image_dir, batch_size=2)
    outcome = service.predict(
        [
            req(png(), "image/png", "a", headers=EXPLAIN),
            req(png(), "image/png", "b", headers=EXPLAIN),
        ]
    )
    assert [r.status for r in outcome.responses] == [200, 200]
    first = body_json(outcome.responses[0])
    # One attribution per input value: 3 channels of the 8x8 crop (model-config.yaml).
    assert (len(first), len(first[0]), len(first[0][0])) == (3, 8, 8)
    assert any(abs(v) > 0 for channel in first for row in channel for v in row)


def test_a_bad_target_is_a_400_naming_it(image_dir: Path) -> None:
    pytest.importorskip("captum")
    service = load_service(image_dir)
    body = json.dumps({"data": __import__("base64").b64encode(png()).decode(), "target": "cat"})
    outcome = service.predict([req(body, "application/json", "a", headers=EXPLAIN)])
    (reply,) = outcome.responses
    assert reply.status == 400 and "target" in body_json(reply)["message"]


def test_without_captum_a_501_that_says_how(
    image_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "captum.attr", None)  # import fails as if not installed
    service = load_service(image_dir)
    outcome = service.predict([req(png(), "image/png", "a", headers=EXPLAIN)])
    (reply,) = outcome.responses
    assert reply.status == 501
    assert "torchbay[explain]" in body_json(reply)["message"]
    # The same worker still predicts.
    assert service.predict([req(png(), "image/png", "b")]).responses[0].status == 200
