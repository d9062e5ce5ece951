"""Train the digits CNN on scikit-learn's bundled load_digits and write everything to archive it.

    python examples/digits/train.py [--out examples/digits/out]

Writes to the output folder: model.py, digits.pt (state dict), example_input.pt (8 preprocessed
test images, batch first), sample_<digit>.png (held-out 8x8 grayscale images), index_to_name.json
and model-config.yaml (the image_classifier preprocessing). Training and serving preprocess
identically: an 8x8 PNG holds the 0-16 digit intensities scaled to 0-255; the handler reads it as
grayscale, scales to [0, 1] and normalizes with mean 0.5 / std 0.5, exactly as done here.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from torchbay.handlers.testing import import_by_path

HERE = Path(__file__).resolve().parent


def _model_module():
    """This example's model.py (by path: every example has one, see ``import_by_path``)."""
    return import_by_path(HERE / "model.py", "_torchbay_example_digits_model")


DigitsNet = _model_module().DigitsNet

MEAN, STD = 0.5, 0.5
MODEL_CONFIG = f"""\
# image_classifier preprocessing for the digits CNN (must match examples/digits/train.py)
handler:
  image:
    resize: [8, 8]
    crop: null
    grayscale: true
    mean: [{MEAN}]
    std: [{STD}]
    topk: 3
"""


def to_pixels(images: np.ndarray) -> np.ndarray:
    """load_digits' 0-16 intensities as 8-bit grayscale pixels (what a PNG stores)."""
    return np.rint(images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)


def preprocess(pixels: np.ndarray) -> torch.Tensor:
    """uint8 [N, 8, 8] -> float32 [N, 1, 8, 8], as the image_classifier handler does."""
    x = torch.from_numpy(pixels.astype(np.float32) / 255.0).unsqueeze(1)
    return (x - MEAN) / STD


def train(out_dir: Path, *, epochs: int = 40, seed: int = 0) -> float:
    """Train, write the artifacts into ``out_dir`` and return held-out accuracy."""
    torch.manual_seed(seed)
    # One thread: this model is too small to gain from more, and extra threads only contend.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(out_dir, epochs, seed)
    finally:
        torch.set_num_threads(threads)


def archive_options(out_dir: Path) -> dict[str, object]:
    """The digits archive's ``ArchiveOptions`` fields from what :func:`train` wrote to
    ``out_dir``: the built-in image_classifier over model.py and digits.pt, with its labels,
    model-config.yaml and example input (the conversion and precision are the caller's)."""
    return {
        "model_name": "digits",
        "model_file": out_dir / "model.py",
        "serialized_file": out_dir / "digits.pt",
        "handler": "image_classifier",
        "extra_files": (str(out_dir / "index_to_name.json"),),
        "config_file": out_dir / "model-config.yaml",
        "example_input": out_dir / "example_input.pt",
    }


def _train(out_dir: Path, epochs: int, seed: int) -> float:
    digits = load_digits()
    pixels = to_pixels(digits.images)
    p_train, p_test, y_train, y_test = train_test_split(
        pixels, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )
    x_train, x_test = preprocess(p_train), preprocess(p_test)
    yt = torch.from_numpy(y_train).long()
    model = DigitsNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x_train), generator=gen).split(64):
            opt.zero_grad()
            loss_fn(model(x_train[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1).numpy() == y_test).mean().item()

    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "model.py", out_dir / "model.py")
    torch.save(model.state_dict(), out_dir / "digits.pt")
    torch.save(x_test[:8].clone(), out_dir / "example_input.pt")
    for digit in range(10):
        i = int(np.flatnonzero(y_test == digit)[0])
        Image.fromarray(p_test[i]).save(out_dir / f"sample_{digit}.png")
    (out_dir / "index_to_name.json").write_text(json.dumps({str(i): str(i) for i in range(10)}))
    (out_dir / "model-config.yaml").write_text(MODEL_CONFIG)
    return float(accuracy)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()
    accuracy = train(args.out, epochs=args.epochs)
    print(f"held-out accuracy: {accuracy:.1%} (360 test images)")
    print(
        f"wrote model.py, digits.pt, example_input.pt, sample_0..9.png, index_to_name.json, "
        f"model-config.yaml to {args.out}"
    )
    return 0 if accuracy > 0.9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
