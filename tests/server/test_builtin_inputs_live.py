"""Hostile or unusual client inputs to the built-in handlers on a live server: each is a 200
with an answer or a 4xx that names the problem, never a 500, and never a worker's memory blown
up by a few bytes (handlers/image_classifier.py, handlers/tensor.py)."""

from __future__ import annotations

import base64
import io
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from torchbay.archiver.package import ArchiveOptions, package

from .conftest import running

pytestmark = pytest.mark.slow


class TinyCNN(torch.nn.Module):
    """Three class scores from an image of ``channels`` channels (1: grayscale, 3: color)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean(dim=(2, 3))


class Segmenter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.conv(x)}


def _encode(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _archive(root: Path, work: Path, name: str, model: torch.nn.Module, config: str) -> None:
    torch.jit.script(model.eval()).save(str(work / f"{name}.pt"))
    (work / f"{name}.yaml").write_text(config)
    handler = {"linear": "tensor", "seg": "image_segmenter"}.get(name, "image_classifier")
    options = ArchiveOptions(
        model_name=name,
        version="1.0",
        serialized_file=work / f"{name}.pt",
        handler=handler,
        config_file=work / f"{name}.yaml",
        export_path=root,
    )
    package(options)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``gray`` (grayscale image classifier over 8x8), ``color`` (TorchServe's default
    transforms: shorter side to 256, crop 224), ``linear`` (the tensor handler) and ``seg``
    (the image segmenter)."""
    root, work = tmp_path_factory.mktemp("inputs-store"), tmp_path_factory.mktemp("inputs")
    torch.manual_seed(0)
    _archive(root, work, "gray", TinyCNN(1), "image:\n  resize: 10\n  crop: 8\n  grayscale: true\n")
    _archive(root, work, "color", TinyCNN(3), "minWorkers: 1\n")
    _archive(root, work, "linear", torch.nn.Linear(4, 3), "minWorkers: 1\n")
    _archive(root, work, "seg", Segmenter(), "image:\n  resize: 10\n  crop: 8\n")
    models = ["gray.mar", "color.mar", "linear.mar", "seg.mar"]
    with running(root, load_models=models) as server:
        yield server


def _post(live: Any, model: str, body: bytes, content_type: str) -> httpx.Response:
    headers = {"content-type": content_type}
    return httpx.post(f"{live.url}/predictions/{model}", content=body, headers=headers, timeout=60)


def test_an_image_in_a_color_space_pil_cannot_turn_gray_directly(live: Any) -> None:
    """A CIELab TIFF to a grayscale model: PIL converts LAB to RGB only; a 200 (was a 500)."""
    lab = _encode(Image.new("LAB", (12, 12), (50, 0, 0)), "TIFF")
    answer = _post(live, "gray", lab, "image/tiff")
    assert answer.status_code == 200, answer.text
    assert len(answer.json()) == 3


@pytest.mark.parametrize("size", [(1, 1500), (1500, 1)])
def test_an_extreme_aspect_ratio_is_a_400_not_a_huge_resize(
    live: Any, size: tuple[int, int]
) -> None:
    """A 1x1500 PNG (under 100 bytes) is 256 x 384000 pixels once its shorter side is resized
    to 256, past the server's image pixel limit (``limit_max_image_pixels``): a 400 that says
    so, before the worker allocates it (a 1 x 60000 one would need 12 GB)."""
    answer = _post(live, "color", _encode(Image.new("L", size), "PNG"), "image/png")
    assert answer.status_code == 400, answer.text
    assert "pixel" in answer.json()["message"]
    normal = _post(live, "color", _encode(Image.new("RGB", (300, 200)), "PNG"), "image/png")
    assert normal.status_code == 200, normal.text


def test_npy_in_any_byte_order_or_dtype_is_an_answer_or_a_400(live: Any) -> None:
    """.npy bodies to the tensor handler: big-endian floats are the same numbers (200, was a
    500); strings, records and datetimes are no tensor: a 400 naming the dtype (was a 500)."""
    ones = _post(live, "linear", _npy(np.ones(4, "<f4")), "application/octet-stream")
    assert ones.status_code == 200, ones.text
    big = _post(live, "linear", _npy(np.ones(4, ">f4")), "application/octet-stream")
    assert big.status_code == 200 and big.json() == ones.json(), big.text
    for array in (
        np.array(["a", "b", "c", "d"]),
        np.zeros(4, dtype=[("a", "<f4")]),
        np.zeros(4, dtype="datetime64[s]"),
    ):
        answer = _post(live, "linear", _npy(array), "application/octet-stream")
        assert answer.status_code == 400, (array.dtype, answer.text)
        assert "dtype" in answer.json()["message"]


def test_base64_with_line_breaks_or_a_data_url_is_the_image(live: Any) -> None:
    """Base64 as the ``base64`` tool writes it (lines of 76, a last newline: TorchServe's
    ``b64decode`` ignores them) and a browser's data URL are the image (were a 400)."""
    png = _encode(Image.new("RGB", (40, 40), (200, 10, 30)), "PNG")
    direct = _post(live, "gray", png, "image/png")
    assert direct.status_code == 200, direct.text
    text = base64.b64encode(png).decode()
    wrapped = "\n".join(textwrap.wrap(text, 76)) + "\n"
    for body, content_type in (
        (wrapped, "text/plain"),
        (json.dumps({"data": wrapped}), "application/json"),
        (json.dumps({"data": f"data:image/png;base64,{text}"}), "application/json"),
    ):
        answer = _post(live, "gray", body.encode(), content_type)
        assert answer.status_code == 200 and answer.json() == direct.json(), answer.text
    broken = _post(
        live, "gray", json.dumps({"data": "data:image/png,%89PNG"}).encode(), "application/json"
    )
    assert broken.status_code == 400 and "base64" in broken.json()["message"]


def test_a_shape_header_of_a_thousand_dimensions_is_a_400(live: Any) -> None:
    """``x-input-shape: 1,1,...,4`` with 1000 dimensions made an answer nested 1000 deep,
    past the JSON encoder's recursion: a 500. Over numpy's 64 dimensions is a 400 now."""
    headers = {"content-type": "application/json", "x-input-shape": "1," * 1000 + "4"}
    answer = httpx.post(
        f"{live.url}/predictions/linear", content=b"[1, 2, 3, 4]", headers=headers, timeout=60
    )
    assert answer.status_code == 400 and "at most 64" in answer.json()["message"], answer.text
    headers["x-input-shape"] = "1," * 10 + "4"
    deep = httpx.post(
        f"{live.url}/predictions/linear", content=b"[1, 2, 3, 4]", headers=headers, timeout=60
    )
    assert deep.status_code == 200, deep.text


def test_explaining_a_segmentation_is_a_501(live: Any) -> None:
    """Integrated Gradients needs a score per class: a segmenter's (and a detector's)
    explanation is a 501 that says so (was a 500, then a 422 "cannot process this input")."""
    png = _encode(Image.new("RGB", (12, 12), (200, 10, 30)), "PNG")
    answer = httpx.post(f"{live.url}/explanations/seg", content=png, timeout=60)
    assert answer.status_code == 501 and "image_segmenter" in answer.json()["message"]
    assert _post(live, "seg", png, "image/png").status_code == 200
