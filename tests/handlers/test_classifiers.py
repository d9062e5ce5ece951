from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from torchbay.handlers.errors import HandlerLoadError
from torchbay.handlers.runtime.service import load_service

from .conftest import body_json, req, write_manifest

LABELS = {"0": "cat", "1": "dog", "2": "bird", "3": ["n0", "fish"]}


class TinyCNN(torch.nn.Module):
    def __init__(self, channels: int = 3) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, 4, 3, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.conv(x)).flatten(1))


def png(size: tuple[int, int] = (20, 12), color: tuple[int, int, int] = (200, 10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    torch.jit.script(TinyCNN().eval()).save(str(tmp_path / "cnn.pt"))
    (tmp_path / "index_to_name.json").write_text(json.dumps(LABELS))
    (tmp_path / "model-config.yaml").write_text("image:\n  resize: 10\n  crop: 8\n  topk: 3\n")
    write_manifest(
        tmp_path, serialized="cnn.pt", handler="image_classifier", config_file="model-config.yaml"
    )
    return tmp_path


def test_image_batch_with_garbage_item(image_dir: Path) -> None:
    service = load_service(image_dir, batch_size=4)
    b64 = base64.b64encode(png()).decode()
    outcome = service.predict(
        [
            req(png(), "image/png", "a"),
            req(b"definitely not an image", "image/png", "b"),
            req(json.dumps({"data": b64}), "application/json", "c"),
            req(json.dumps({"data": "%%%"}), "application/json", "d"),
        ]
    )
    assert [r.status for r in outcome.responses] == [200, 400, 200, 400]
    first, third = body_json(outcome.responses[0]), body_json(outcome.responses[2])
    assert len(first) == 3 and set(first) <= {"cat", "dog", "bird", "fish"}
    assert first == pytest.approx(third)  # same image, same answer, sent two ways
    assert sum(first.values()) <= 1.0 + 1e-6
    assert list(first.values()) == sorted(first.values(), reverse=True)
    assert body_json(outcome.responses[1])["type"] == "BadInput"


def test_all_items_bad_skips_inference(image_dir: Path) -> None:
    service = load_service(image_dir)
    outcome = service.predict([req(b"x", "image/png"), req(b"y", "image/png")])
    assert [r.status for r in outcome.responses] == [400, 400]
    assert "inference" not in outcome.timings


def test_decompression_bomb_is_400(image_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service = load_service(image_dir)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    outcome = service.predict([req(png((20, 12)), "image/png"), req(png((5, 5)), "image/png")])
    assert [r.status for r in outcome.responses] == [400, 200]
    assert "too large" in body_json(outcome.responses[0])["message"]


def test_grayscale_from_config(tmp_path: Path) -> None:
    torch.jit.script(TinyCNN(channels=1).eval()).save(str(tmp_path / "g.pt"))
    (tmp_path / "c.yaml").write_text("image: {grayscale: true, resize: null, crop: 8}\n")
    write_manifest(tmp_path, serialized="g.pt", handler="image_classifier", config_file="c.yaml")
    outcome = load_service(tmp_path).predict([req(png(), "image/png")])
    assert outcome.responses[0].status == 200
    assert set(body_json(outcome.responses[0])) <= {"0", "1", "2", "3"}  # no mapping: indices


class BagModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4, padding_idx=0)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(ids).mean(dim=1))


def text_dir(tmp_path: Path, vocab_name: str) -> Path:
    torch.manual_seed(0)
    torch.jit.script(BagModel().eval()).save(str(tmp_path / "text.pt"))
    tokens = ["<pad>", "<unk>", "good", "bad", "movie", "!"]
    if vocab_name.endswith(".json"):
        (tmp_path / vocab_name).write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    else:
        (tmp_path / vocab_name).write_text("\n".join(tokens) + "\n")
    (tmp_path / "index_to_name.json").write_text(json.dumps({"0": "neg", "1": "pos"}))
    write_manifest(tmp_path, serialized="text.pt", handler="text_classifier")
    return tmp_path


@pytest.mark.parametrize("vocab_name", ["vocab.json", "vocab.txt"])
def test_text_classifier(tmp_path: Path, vocab_name: str) -> None:
    service = load_service(text_dir(tmp_path, vocab_name), batch_size=3)
    handler = service.handler
    assert handler.tokenize("Good movie!") == [2, 4, 5]
    assert handler.tokenize("unseen") == [1]
    outcome = service.predict(
        [
            req("Good movie!", "text/plain", "a"),
            req("   ", "text/plain", "b"),
            req(json.dumps({"text": "bad"}), "application/json", "c"),
        ]
    )
    assert [r.status for r in outcome.responses] == [200, 400, 200]
    assert set(body_json(outcome.responses[0])) == {"neg", "pos"}


def test_text_classifier_without_vocab(tmp_path: Path) -> None:
    text_dir(tmp_path, "vocab.json").joinpath("vocab.json").unlink()
    with pytest.raises(HandlerLoadError, match="vocabulary"):
        load_service(tmp_path)


def test_image_over_v2_envelope(image_dir: Path) -> None:
    b64 = base64.b64encode(png()).decode()
    request = {"inputs": [{"name": "img", "shape": [1], "datatype": "BYTES", "data": [b64]}]}
    outcome = load_service(image_dir).predict([req(json.dumps(request), protocol="v2")])
    assert outcome.responses[0].status == 200, outcome.responses[0].body
    [out] = body_json(outcome.responses[0])["outputs"]
    assert out["datatype"] == "BYTES" and len(json.loads(out["data"][0])) == 3


@pytest.mark.parametrize("payload", [b"not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 40])
def test_an_undecodable_image_is_a_400_without_internal_detail(payload: bytes) -> None:
    from torchbay.handlers.errors import BadInput
    from torchbay.handlers.image_classifier import decode_image

    with pytest.raises(BadInput) as info:
        decode_image(payload)
    message = str(info.value)
    assert message.startswith("cannot decode image")
    assert "0x" not in message and "BytesIO" not in message
