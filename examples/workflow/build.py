"""Build the read_digit workflow: a scan shrinker chained to the digits classifier.

    python examples/workflow/build.py [--out examples/workflow/out]

1. trains the digits CNN (examples/digits/train.py) and archives it: OUT/model_store/digits.mar
   (built-in image_classifier);
2. builds the shrink model in code (a 4x4 average pool, TorchScript) and archives it with
   shrink_handler.py: OUT/model_store/shrink.mar;
3. archives the workflow with TorchServe's torch-workflow-archiver (0.2.15, torchbay's dev
   extra): OUT/wf_store/read_digit.war = workflow.yaml + workflow_handler.py.
Also writes OUT/scan_<digit>.png: held-out digits as noisy 32x32 scans.
"""

from __future__ import annotations

import subprocess
import sys
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
    """Both model archives, the scans, and the workflow archive (returned)."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    store = out / "model_store"
    digits = _digits_train()
    accuracy = digits.train(out, epochs=epochs)
    if accuracy <= 0.9:
        raise SystemExit(f"digits accuracy too low: {accuracy:.1%}")
    package_example(store, **digits.archive_options(out), convert="torchscript-trace")
    torch.jit.save(torch.jit.script(torch.nn.AvgPool2d(4).eval()), str(out / "shrink.pt"))
    package_example(
        store,
        model_name="shrink",
        serialized_file=out / "shrink.pt",
        handler=str(HERE / "shrink_handler.py"),
    )
    write_scans(out)
    return build_war(out / "wf_store")


def build_war(wf_store: Path) -> Path:
    """read_digit.war, made by torch-workflow-archiver (what TorchServe users run)."""
    wf_store.mkdir(parents=True, exist_ok=True)
    archiver = "from workflow_archiver.workflow_packaging import generate_workflow_archive; "
    args = {
        "--workflow-name": "read_digit",
        "--spec-file": str(HERE / "workflow.yaml"),
        "--handler": str(HERE / "workflow_handler.py"),
        "--export-path": str(wf_store),
    }
    command = [sys.executable, "-c", archiver + "generate_workflow_archive()"]
    subprocess.run([*command, *(x for pair in args.items() for x in pair), "-f"], check=True)
    return wf_store / "read_digit.war"


if __name__ == "__main__":
    out = example_out(__doc__, HERE / "out")
    print(f"wrote {build(out)}; sample scans {out}/scan_0.png .. scan_9.png")
