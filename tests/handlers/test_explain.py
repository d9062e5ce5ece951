"""Explanations (handlers/runtime/explain.py): the built-in image classifier answers Captum's
Integrated Gradients for ``explain: True`` requests, as TorchServe's VisionHandler; a bad target is
a 400 naming it; without Captum the answer is a 501 that says how to install it."""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
import sys
import zipfile
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
JSON = "application/json"


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


TEXT_DATA = Path(__file__).parents[1] / "data" / "torchserve" / "explain_text"


def _text_model() -> torch.nn.Module:
    """TorchServe's recorded text_classifier model (its model.py and its archive's weights)."""
    # Under a name of its own: other tests import modules called "model" too.
    spec = importlib.util.spec_from_file_location("explain_text_model", TEXT_DATA / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TextModel()
    with zipfile.ZipFile(TEXT_DATA / "text.mar") as mar:
        model.load_state_dict(torch.load(io.BytesIO(mar.read("model.pt")), weights_only=True))
    return model.eval()


def test_text_attributions_are_torchserve_s_numbers_on_torchserve_s_inputs() -> None:
    """Given the token ids TorchServe's handler makes (words, then bigrams, from its
    source_vocab.pt), torchbay's Layer Integrated Gradients and summary give the importances
    TorchServe 0.12 answered (answers.json), to float precision."""
    pytest.importorskip("captum")
    from torchbay.handlers.runtime import explain

    recorded = json.loads((TEXT_DATA / "answers.json").read_text())["answers"][0]
    words = recorded["body"]["words"]
    with zipfile.ZipFile(TEXT_DATA / "text.mar") as mar:
        vocab = torch.load(io.BytesIO(mar.read("source_vocab.pt")), weights_only=True)
    grams = words + [" ".join(pair) for pair in itertools.pairwise(words)]
    ids = torch.tensor([vocab[g] for g in grams])
    offsets = torch.tensor([0])
    attributions = explain.layer_integrated_gradients(
        _text_model(), ids, torch.zeros_like(ids), (offsets,), 0
    )
    importances = explain.summarize(attributions)
    expected = torch.tensor(recorded["body"]["importances"])
    assert torch.allclose(torch.tensor(importances), expected, atol=1e-5), importances


PADDED_TEXT = """
import torch


class PaddedText(torch.nn.Module):
    \"\"\"Padded token ids in, an Embedding (per token) averaged, two classes out.\"\"\"

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(8, 3)
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, ids):
        return self.fc(self.embedding(ids).mean(dim=1))
"""


def _padded_text(folder: Path) -> torch.nn.Module:
    """PADDED_TEXT's model, seeded, its source written to ``folder``/model.py."""
    (folder / "model.py").write_text(PADDED_TEXT)
    space: dict[str, object] = {}
    exec(compile(PADDED_TEXT, str(folder / "model.py"), "exec"), space)
    torch.manual_seed(0)
    return space["PaddedText"]().eval()  # type: ignore[operator]


@pytest.fixture
def padded_text_dir(tmp_path: Path) -> Path:
    torch.save(_padded_text(tmp_path).state_dict(), tmp_path / "model.pt")
    words = ["<pad>", "<unk>", "good", "bad", "film", "a", "very", "!"]
    (tmp_path / "vocab.json").write_text(json.dumps({w: i for i, w in enumerate(words)}))
    write_manifest(
        tmp_path, serialized="model.pt", model_file="model.py", handler="text_classifier"
    )
    return tmp_path


def test_text_explanations_for_each_request_of_a_batch(padded_text_dir: Path) -> None:
    """Per token of each text (an Embedding's rows), each request with its own target; a bad
    target fails its request alone; a request without explain is still a prediction."""
    pytest.importorskip("captum")
    service = load_service(padded_text_dir, batch_size=3)
    outcome = service.predict(
        [
            req("a very good film!", "text/plain", "a", headers=EXPLAIN),
            req(json.dumps({"text": "bad", "target": 1}), JSON, "b", headers=EXPLAIN),
            req(json.dumps({"text": "bad", "target": "x"}), JSON, "c", headers=EXPLAIN),
        ]
    )
    assert [r.status for r in outcome.responses] == [200, 200, 400]
    first, second = (body_json(r) for r in outcome.responses[:2])
    assert first["words"] == ["a", "very", "good", "film", "!"]
    assert [len(row) for row in first["importances"]] == [3] * 5  # a row per token
    assert second["words"] == ["bad"] and len(second["importances"]) == 1
    target_zero = service.predict([req("bad", "text/plain", "d", headers=EXPLAIN)])
    assert body_json(target_zero.responses[0])["importances"] != second["importances"]
    plain = service.predict([req("good film", "text/plain", "e")]).responses[0]
    assert plain.status == 200 and "importances" not in body_json(plain)


def test_a_torchscript_text_model_is_a_501_for_explanations(tmp_path: Path) -> None:
    pytest.importorskip("captum")
    torch.jit.script(_padded_text(tmp_path)).save(str(tmp_path / "model.pt"))
    (tmp_path / "vocab.json").write_text(json.dumps({"<pad>": 0, "good": 1}))
    write_manifest(tmp_path, serialized="model.pt", handler="text_classifier")
    service = load_service(tmp_path)
    (reply,) = service.predict([req("good", "text/plain", "a", headers=EXPLAIN)]).responses
    assert reply.status == 501 and "eager model" in body_json(reply)["message"]
