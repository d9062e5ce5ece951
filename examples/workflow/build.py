"""Build the read_digit workflow: a scan shrinker chained to the digits classifier.

    python examples/workflow/build.py [--out examples/workflow/out]

1. trains the digits CNN (examples/digits/train.py) and archives it: digits.mar
   (built-in image_classifier);
2. builds the shrink model in code (a 4x4 average pool, TorchScript) and archives it with
   shrink_handler.py: shrink.mar;
3. archives the workflow: read_digit.mar = workflow_handler.py + workflow.yaml + both archives.
Also writes OUT/scan_<digit>.png: held-out digits as noisy 32x32 scans.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from torchbay.handlers.testing import example_out, import_by_path, package_example

HERE = Path(__file__).resolve().parent
DIGITS = HERE.parent / "digits"


def _digits_train():
    return import_by_path(DIGITS / "train.py", "_workflow_digits_train")


def write_scans(out: Path, seed: int = 7) -> None:
    """Each sample_<d>.png (8x8) blown up 4x with noise: the workflow's input."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for digit in range(10):
        small = np.asarray(Image.open(out / f"sample_{digit}.png"), dtype=np.float32)
        big = np.kron(small, np.ones((4, 4), dtype=np.float32))
        noisy = np.clip(big + rng.uniform(-24, 24, big.shape), 0, 255)
        Image.fromarray(np.rint(noisy).astype(np.uint8), "L").save(out / f"scan_{digit}.png")


def build(out: Path, epochs: int = 40) -> Path:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    nodes = out / "nodes"
    accuracy = _digits_train().train(out, epochs=epochs)
    if accuracy <= 0.9:
        raise SystemExit(f"digits accuracy too low: {accuracy:.1%}")
    package_example(
        nodes,
        model_name="digits",
        model_file=out / "model.py",
        serialized_file=out / "digits.pt",
        handler="image_classifier",
        extra_files=(str(out / "index_to_name.json"),),
        config_file=out / "model-config.yaml",
        convert="torchscript-trace",
        example_input=out / "example_input.pt",
    )
    torch.jit.save(torch.jit.script(torch.nn.AvgPool2d(4).eval()), str(out / "shrink.pt"))
    package_example(
        nodes,
        model_name="shrink",
        serialized_file=out / "shrink.pt",
        handler=str(HERE / "shrink_handler.py"),
    )
    write_scans(out)
    return package_example(
        out / "model_store",
        model_name="read_digit",
        handler=str(HERE / "workflow_handler.py"),
        extra_files=(
            str(HERE / "workflow.yaml"),
            str(nodes / "shrink.mar"),
            str(nodes / "digits.mar"),
        ),
    )


if __name__ == "__main__":
    out = example_out(__doc__, HERE / "out")
    print(f"wrote {build(out)}; sample scans {out}/scan_0.png .. scan_9.png")
