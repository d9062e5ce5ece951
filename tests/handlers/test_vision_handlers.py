"""TorchServe's ``object_detector`` and ``image_segmenter`` built-in handlers, without torchvision:
tiny TorchScript models with torchvision's output shapes (detection: one ``{boxes, labels,
scores}`` dict per image; segmentation: ``{"out": N x K x H x W}``), served by the worker's own
service from an archive directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchbay.handlers.runtime.service import load_service

from .conftest import body_json, req, write_manifest
from .test_classifiers import png

LABELS = {"1": "person", "2": "dog"}


class TinyDetector(torch.nn.Module):
    """Two boxes per image: the whole image scored by its mean brightness, and a small one
    scored 0.1 (under the 0.5 threshold)."""

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        out: list[dict[str, torch.Tensor]] = []
        for image in images:
            h, w = float(image.shape[-2]), float(image.shape[-1])
            boxes = torch.tensor([[0.0, 0.0, w, h], [1.0, 1.0, 2.0, 2.0]])
            scores = torch.stack([image.mean(), torch.tensor(0.1)])
            out.append({"boxes": boxes, "labels": torch.tensor([1, 2]), "scores": scores})
        return out


class StackedDetector(torch.nn.Module):
    """The same answer from a stacked N x 3 x H x W batch (TorchServe's input to a detector)."""

    def forward(self, batch: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        out: list[dict[str, torch.Tensor]] = []
        for image in batch:
            box = torch.tensor([[0.0, 0.0, float(batch.shape[-1]), float(batch.shape[-2])]])
            out.append({"boxes": box, "labels": torch.tensor([1]), "scores": image.mean()[None]})
        return out


class TinySegmenter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.conv(x)}


def _archive(folder: Path, model: torch.nn.Module, handler: str, config: str = "") -> Path:
    folder.mkdir()
    torch.manual_seed(0)
    torch.jit.script(model.eval()).save(str(folder / "model.pt"))
    (folder / "index_to_name.json").write_text(json.dumps(LABELS))
    extra = {}
    if config:
        (folder / "model-config.yaml").write_text(config)
        extra["config_file"] = "model-config.yaml"
    write_manifest(folder, serialized="model.pt", handler=handler, **extra)
    return folder


def test_detector_answers_labelled_boxes_over_the_threshold(tmp_path: Path) -> None:
    service = load_service(_archive(tmp_path / "d", TinyDetector(), "object_detector"))
    bright, dark = png((20, 12), (250, 250, 250)), png((7, 9), (10, 10, 10))
    outcome = service.predict([req(bright, "image/png"), req(dark, "image/png")])
    assert [r.status for r in outcome.responses] == [200, 200]
    [found], none = body_json(outcome.responses[0]), body_json(outcome.responses[1])
    # No resize or crop (TorchServe's ToTensor alone): the box is the whole 20 x 12 image.
    assert found["person"] == [0.0, 0.0, 20.0, 12.0]
    assert found["score"] == pytest.approx(250 / 255, abs=1e-3)
    assert none == []  # the dark image's mean is under 0.5, the small box always is


def test_detector_threshold_and_a_stacked_batch(tmp_path: Path) -> None:
    folder = _archive(
        tmp_path / "d", StackedDetector(), "object_detector", "image:\n  threshold: 0.02\n"
    )
    service = load_service(folder, batch_size=2)
    dark = png((8, 8), (10, 10, 10))
    outcome = service.predict([req(dark, "image/png"), req(dark, "image/png")])
    assert [body_json(r) for r in outcome.responses] == [
        [{"person": [0.0, 0.0, 8.0, 8.0], "score": pytest.approx(10 / 255, abs=1e-3)}]
    ] * 2


def test_detector_with_a_bad_model_output_fails_the_batch_with_500(tmp_path: Path) -> None:
    service = load_service(_archive(tmp_path / "d", TinySegmenter(), "object_detector"))
    outcome = service.predict([req(png(), "image/png")])
    assert outcome.responses[0].status == 500
    assert "boxes, labels, scores" in body_json(outcome.responses[0])["message"]


def test_segmenter_answers_class_and_probability_per_pixel(tmp_path: Path) -> None:
    config = "image:\n  resize: 10\n  crop: 8\n"
    service = load_service(_archive(tmp_path / "s", TinySegmenter(), "image_segmenter", config))
    outcome = service.predict([req(png(), "image/png"), req(b"not an image", "image/png")])
    assert [r.status for r in outcome.responses] == [200, 400]
    pixels = torch.tensor(body_json(outcome.responses[0]))
    assert pixels.shape == (8, 8, 2)
    assert set(pixels[..., 0].unique().tolist()) <= {0.0, 1.0, 2.0}
    assert bool(((pixels[..., 1] > 1 / 3) & (pixels[..., 1] <= 1)).all())  # the top of 3 classes


def test_torchserve_imports_of_both_handlers_resolve_to_torchbays() -> None:
    from torchbay.handlers.runtime.resolve import install_ts_alias

    install_ts_alias()
    from ts.torch_handler.image_segmenter import ImageSegmenter
    from ts.torch_handler.object_detector import ObjectDetector

    assert ObjectDetector.__module__ == "torchbay.handlers.object_detector"
    assert ImageSegmenter.__module__ == "torchbay.handlers.image_segmenter"
