"""examples/detection: image in, a JSON list of labelled boxes out, from the real server."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from .conftest import example_module, png_header

pytestmark = pytest.mark.slow


def _iou(a: list[int], b: list[int]) -> float:
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])
    return w * h / (area - w * h)


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def test_detection_finds_every_box(serve, tmp_path: Path) -> None:
    out = tmp_path / "out"
    mar = Path(example_module("detection").build(out, scenes=4))
    server = serve(mar.parent, load_models=["shapes.mar"])
    truth = json.loads((out / "scenes.json").read_text())
    url = f"{server.url}/predictions/shapes"
    with httpx.Client(timeout=60) as client:
        for i, expected in enumerate(truth):
            reply = client.post(url, content=(out / f"scene_{i}.png").read_bytes())
            assert reply.status_code == 200, reply.text
            found = reply.json()
            assert isinstance(found, list) and len(found) == len(expected)
            for obj in expected:
                best = max(found, key=lambda f, o=obj: _iou(f["box"], o["box"]))
                assert best["label"] == obj["label"] and _iou(best["box"], obj["box"]) > 0.8
                assert 0.5 < best["score"] <= 1.0
        empty = client.post(url, content=_png(np.zeros((40, 40, 3), dtype=np.uint8)))
        assert empty.status_code == 200 and empty.json() == []
        assert client.post(url, content=b"not an image").status_code == 400
        huge = client.post(url, content=_png(np.zeros((600, 8, 3), dtype=np.uint8)))
        assert huge.status_code == 413 and "512" in huge.json()["message"]
        # Past PIL's pixel limit the header alone is refused: too large (413), not a 500.
        for side in (20_000, 100_000):
            bomb = client.post(url, content=png_header(side, side))
            assert bomb.status_code == 413 and "512" in bomb.json()["message"], bomb.text
        truncated = client.post(url, content=(out / "scene_0.png").read_bytes()[:200])
        assert truncated.status_code == 400, truncated.text
