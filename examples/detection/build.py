"""Train the per-pixel colour detector on synthetic scenes and archive it with its handler.

    python examples/detection/build.py [--out examples/detection/out]

Writes OUT/model_store/shapes.mar and OUT/scene_<i>.png with OUT/scenes.json (the true boxes).
A scene is a noisy dark canvas with a few non-overlapping red, green or blue rectangles.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torchbay.handlers.testing import example_out, import_by_path, package_example_model

HERE = Path(__file__).resolve().parent


def model_module():
    """This example's model.py (by path: every example has one, see ``import_by_path``)."""
    return import_by_path(HERE / "model.py", f"_torchbay_example_{HERE.name}_model")


COLORS = {"red": (0.85, 0.15, 0.1), "green": (0.1, 0.75, 0.2), "blue": (0.15, 0.2, 0.9)}
MODEL_CONFIG = """\
handler:
  min_area: 16     # regions smaller than this many pixels are noise, not objects
  max_side: 512    # larger images are refused (413) before they reach the model
"""


@dataclass
class Scene:
    pixels: np.ndarray  # [H, W, 3] float32 in [0, 1]
    boxes: list[dict]  # {"label", "box": [x0, y0, x1, y1]}


def make_scene(rng: np.random.Generator, size: int = 64, objects: int = 3) -> Scene:
    pixels = rng.uniform(0.0, 0.25, (size, size, 3)).astype(np.float32)
    taken = np.zeros((size, size), dtype=bool)
    boxes: list[dict] = []
    for _ in range(objects * 20):
        if len(boxes) == objects:
            break
        w, h = (int(v) for v in rng.integers(6, size // 3, 2))
        x0, y0 = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
        if taken[max(0, y0 - 2) : y0 + h + 2, max(0, x0 - 2) : x0 + w + 2].any():
            continue
        taken[y0 : y0 + h, x0 : x0 + w] = True
        label = list(COLORS)[int(rng.integers(0, len(COLORS)))]
        color = np.array(COLORS[label], dtype=np.float32)
        noise = rng.normal(0.0, 0.05, (h, w, 3)).astype(np.float32)
        pixels[y0 : y0 + h, x0 : x0 + w] = np.clip(color + noise, 0.0, 1.0)
        boxes.append({"label": label, "box": [x0, y0, x0 + w, y0 + h]})
    return Scene(pixels, boxes)


def _targets(scene: Scene) -> np.ndarray:
    target = np.zeros(scene.pixels.shape[:2], dtype=np.int64)
    for obj in scene.boxes:
        x0, y0, x1, y1 = obj["box"]
        target[y0:y1, x0:x1] = 1 + list(COLORS).index(obj["label"])
    return target


def train(seed: int = 0, steps: int = 60):
    import torch

    ColorBlobNet = model_module().ColorBlobNet

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    scenes = [make_scene(rng, size=32, objects=2) for _ in range(16)]  # per-pixel: small suffices
    x = torch.from_numpy(np.stack([s.pixels for s in scenes])).permute(0, 3, 1, 2)
    y = torch.from_numpy(np.stack([_targets(s) for s in scenes]))
    model = ColorBlobNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.nll_loss(torch.log(model(x) + 1e-9), y)
        loss.backward()
        optimizer.step()
    return model.eval(), x[:2]


def to_png(pixels: np.ndarray, path: Path) -> Path:
    from PIL import Image

    Image.fromarray(np.rint(pixels * 255).astype(np.uint8), "RGB").save(path)
    return path


def build(out: Path, scenes: int = 4) -> Path:
    """Train, archive, write sample scenes; returns the archive's path."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    model, example = train()
    torch.save(model.state_dict(), out / "shapes.pt")
    torch.save(example, out / "example_input.pt")
    (out / "model-config.yaml").write_text(MODEL_CONFIG)
    rng = np.random.default_rng(1234)
    truth = []
    for i in range(scenes):
        scene = make_scene(rng)
        to_png(scene.pixels, out / f"scene_{i}.png")
        truth.append(scene.boxes)
    (out / "scenes.json").write_text(json.dumps(truth))
    return package_example_model(
        HERE,
        out,
        "shapes",
        str(HERE / "detection_handler.py"),
        convert="torchscript-trace",
        example_input=out / "example_input.pt",
    )


if __name__ == "__main__":
    out = example_out(__doc__, HERE / "out")
    print(f"wrote {build(out)}; sample scenes {out}/scene_*.png, true boxes {out}/scenes.json")
