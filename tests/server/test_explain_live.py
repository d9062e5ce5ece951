"""Explanations on a live server: TorchServe's ``/explanations/{m}`` and KServe v1's
``/v1/models/{m}:explain`` reach the image classifier's Captum path (handlers/runtime/explain.py)
through the same plane as predictions; a handler without explanations answers 501."""

from __future__ import annotations

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from PIL import Image

from torchbay.archiver.package import ArchiveOptions, package

from .conftest import running

pytestmark = pytest.mark.slow


class TinyCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(self.conv(x), 1).flatten(1))


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (12, 12), (200, 30, 10)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root, work = tmp_path_factory.mktemp("explain-store"), tmp_path_factory.mktemp("explain")
    torch.manual_seed(0)
    torch.jit.script(TinyCNN().eval()).save(str(work / "cnn.pt"))
    (work / "model-config.yaml").write_text("image:\n  resize: 10\n  crop: 8\n")
    for name, handler in (("cnn", "image_classifier"), ("plain", "base")):
        options = ArchiveOptions(
            model_name=name,
            version="1.0",
            serialized_file=work / "cnn.pt",
            handler=handler,
            config_file=work / "model-config.yaml",
            export_path=root,
        )
        package(options)
    return root


def test_explanations_over_torchserve_and_kserve_v1(store: Path) -> None:
    pytest.importorskip("captum")
    with running(store, load_models=["cnn.mar", "plain.mar"]) as live:
        ts = httpx.post(f"{live.url}/explanations/cnn", content=_png(), timeout=60)
        assert ts.status_code == 200, ts.text
        assert (len(ts.json()), len(ts.json()[0])) == (3, 8)  # channels, rows of the 8x8 crop
        instance = {"data": base64.b64encode(_png()).decode()}
        body = {"instances": [instance, instance]}
        v1 = httpx.post(f"{live.url}/v1/models/cnn:explain", json=body, timeout=60)
        assert v1.status_code == 200, v1.text
        explanations = v1.json()["explanations"]
        assert len(explanations) == 2
        assert torch.allclose(torch.tensor(explanations[0]), torch.tensor(ts.json()), atol=1e-6)
        predicted = httpx.post(f"{live.url}/predictions/cnn", content=_png(), timeout=60)
        assert predicted.status_code == 200 and isinstance(predicted.json(), dict)
        none = httpx.post(f"{live.url}/v1/models/plain:explain", json={"instances": [[0.0]]})
        assert none.status_code == 501, none.text
        assert "explanations" in none.json()["message"]


TEXT_DATA = Path(__file__).parents[1] / "data" / "torchserve" / "explain_text"


def test_text_explanations_have_torchserve_s_shape_on_its_archive() -> None:
    """TorchServe's own text_classifier archive (tests/data/torchserve/explain_text: an
    EmbeddingBag model, made by TorchServe's archiver), explained by torchbay over both routes;
    TorchServe 0.12's recorded answer gives the shape: one ``{"importances", "words"}``, the
    bag's one row of embedding-width importances, the text's words. The values differ by
    design: TorchServe's handler also feeds the text's bigrams to the bag, torchbay's does not."""
    pytest.importorskip("captum")
    recorded = json.loads((TEXT_DATA / "answers.json").read_text())["answers"]
    theirs = next(a for a in recorded if a["id"] == "explain")
    text = theirs["request"]["body"]
    with running(TEXT_DATA, load_models=["text.mar"]) as live:
        ours = httpx.post(f"{live.url}/explanations/text", content=text.encode(), timeout=120)
        assert ours.status_code == 200, ours.text
        body = ours.json()
        assert body.keys() == theirs["body"].keys() == {"importances", "words"}
        assert body["words"] == theirs["body"]["words"]
        shape = [len(body["importances"]), len(body["importances"][0])]
        assert shape == [len(theirs["body"]["importances"]), len(theirs["body"]["importances"][0])]
        assert torch.tensor(body["importances"]).sum(-1).norm().item() == pytest.approx(1.0)

        # KServe v1: one explanation per instance, each with its own target class.
        instances = [{"data": text}, {"text": text, "target": 1}]
        v1 = httpx.post(
            f"{live.url}/v1/models/text:explain", json={"instances": instances}, timeout=120
        )
        assert v1.status_code == 200, v1.text
        (their_v1,) = json.loads((TEXT_DATA / "answers.json").read_text())["kserve_answers"]
        assert v1.json().keys() == their_v1["body"].keys() == {"explanations"}
        first, second = v1.json()["explanations"]
        assert first.keys() == their_v1["body"]["explanations"][0].keys()
        assert first == body  # target 0, as /explanations answered
        assert second["words"] == body["words"] and second["importances"] != body["importances"]

        bad = httpx.post(
            f"{live.url}/explanations/text", json={"text": text, "target": "x"}, timeout=60
        )
        assert bad.status_code == 400 and "target must be a class index" in bad.text
        predicted = httpx.post(f"{live.url}/predictions/text", content=text.encode(), timeout=60)
        their_prediction = next(a for a in recorded if a["id"] == "predict")["body"]
        assert predicted.status_code == 200 and predicted.json().keys() == their_prediction.keys()


def _batched_store(root: Path, work: Path) -> None:
    """``pair``: the image classifier with batches of two, gathered for up to 20 s (two
    concurrent requests always run as one batch)."""
    torch.manual_seed(0)
    torch.jit.script(TinyCNN().eval()).save(str(work / "cnn.pt"))
    config = work / "pair.yaml"
    config.write_text("batchSize: 2\nmaxBatchDelay: 20000\nimage:\n  resize: 10\n  crop: 8\n")
    options = ArchiveOptions(
        model_name="pair",
        version="1.0",
        serialized_file=work / "cnn.pt",
        handler="image_classifier",
        config_file=config,
        export_path=root,
    )
    package(options)


def _pair(url: str, first: tuple[str, Any], second: tuple[str, Any]) -> list[httpx.Response]:
    """Two concurrent POSTs ``(path, json body)``: the batch of two of ``pair``."""
    with ThreadPoolExecutor(2) as pool:
        calls = [
            pool.submit(httpx.post, url + path, json=body, timeout=60)
            for path, body in (first, second)
        ]
        return [call.result() for call in calls]


def _close(ours: Any, theirs: Any) -> bool:
    return torch.allclose(torch.tensor(ours), torch.tensor(theirs), atol=1e-6)


@pytest.fixture(scope="module")
def pair_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root, work = tmp_path_factory.mktemp("pair-store"), tmp_path_factory.mktemp("pair")
    _batched_store(root, work)
    return root


def _alone(url: str, image: str, target: int) -> httpx.Response:
    """The explanation for ``target`` in a batch of two requests just like it."""
    return _pair(url, *[("/explanations/pair", {"data": image, "target": target})] * 2)[0]


def test_a_batch_of_a_prediction_and_an_explanation_answers_each_its_own(
    pair_store: Path,
) -> None:
    """A prediction and an explanation gathered into one batch: each gets what it asked for
    (TorchServe's handlers read the first request's ``explain`` header for the whole batch)."""
    pytest.importorskip("captum")
    image = base64.b64encode(_png()).decode()
    with running(pair_store, load_models=["pair.mar"]) as live:
        explained = _alone(live.url, image, 0)
        for paths in (("predictions", "explanations"), ("explanations", "predictions")):
            answers = _pair(live.url, *[(f"/{p}/pair", {"data": image}) for p in paths])
            for path, answer in zip(paths, answers, strict=True):
                assert answer.status_code == 200, answer.text
                if path == "predictions":
                    assert isinstance(answer.json(), dict), answer.text[:200]
                else:
                    assert isinstance(answer.json(), list), answer.text[:200]
                    assert _close(answer.json(), explained.json())


def test_each_explanation_of_a_batch_is_for_its_own_target(pair_store: Path) -> None:
    """Two explanations of one batch with different targets: each for its own (TorchServe's
    handler explains the whole batch for the first request's target). A target the model has
    no class for is a 422 of its request alone, not a 500."""
    pytest.importorskip("captum")
    image = base64.b64encode(_png()).decode()
    with running(pair_store, load_models=["pair.mar"]) as live:
        alone = {t: _alone(live.url, image, t) for t in (0, 2)}
        assert all(r.status_code == 200 for r in alone.values())
        assert not _close(alone[0].json(), alone[2].json())
        targets = _pair(
            live.url,
            ("/explanations/pair", {"data": image, "target": 0}),
            ("/explanations/pair", {"data": image, "target": 2}),
        )
        for answer, t in zip(targets, (0, 2), strict=True):
            assert answer.status_code == 200 and _close(answer.json(), alone[t].json()), t
        wrong = _pair(
            live.url,
            ("/explanations/pair", {"data": image, "target": 99}),
            ("/explanations/pair", {"data": image, "target": 2}),
        )
        assert wrong[0].status_code == 422 and "request id" in wrong[0].json()["message"]
        assert wrong[1].status_code == 200 and _close(wrong[1].json(), alone[2].json())


WIDE_TEXT = """
import torch


class WideText(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(4, 256)
        self.fc = torch.nn.Linear(256, 2)

    def forward(self, ids):
        return self.fc(self.embedding(ids).mean(dim=1))
"""


def _peak_rss_mb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return (
        int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
        // 1024
    )


def test_a_long_text_s_explanation_does_not_take_fifty_times_its_memory(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Layer Integrated Gradients runs its 50 steps in one forward pass: a 20 000-token text
    (no ``max_length``) over a 256-wide embedding took a worker to 3.8 GB. The steps now go
    in passes of at most 65 536 tokens (explain.steps_per_pass): the same numbers, a bounded
    peak."""
    pytest.importorskip("captum")
    root, work = tmp_path_factory.mktemp("wide-store"), tmp_path_factory.mktemp("wide")
    space: dict[str, Any] = {}
    exec(WIDE_TEXT, space)
    torch.manual_seed(0)
    torch.save(space["WideText"]().state_dict(), work / "model.pt")
    (work / "model.py").write_text(WIDE_TEXT)
    (work / "vocab.txt").write_text("<pad>\n<unk>\ngood\nbad\n")
    options = ArchiveOptions(
        model_name="wide",
        version="1.0",
        model_file=work / "model.py",
        serialized_file=work / "model.pt",
        handler="text_classifier",
        extra_files=(str(work / "vocab.txt"),),
        export_path=root,
    )
    package(options)
    with running(root, load_models=["wide.mar"], max_response_size=1 << 28) as live:
        (pid,) = live.worker_pids()
        answer = httpx.post(f"{live.url}/explanations/wide", content="good " * 20000, timeout=300)
        assert answer.status_code == 200, answer.text[:300]
        assert len(answer.json()["importances"]) == 20000
        assert _peak_rss_mb(pid) < 2000
