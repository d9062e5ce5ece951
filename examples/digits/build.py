"""Train the digits CNN, archive four variants and verify each on a sample image.

    .venv/bin/python examples/digits/build.py [--out examples/digits/out] [--store DIR]

Variants (all with the image_classifier handler and the parity check):
  digits        fp32 TorchScript (trace) with --optimize
  digits-int8   int8-dynamic torch.export program (.pt2), as the quickstart
  digits-fp16   fp16 TorchScript (trace)
  digits-export fp32 torch.export program (.pt2, dynamic batch)
Each archive is checked with ``torchbay verify --input sample_<d>.png``; the script fails unless the
top label is the right digit. Exit status 0 when every variant passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS: dict[str, list[str]] = {
    "digits": ["--convert", "torchscript-trace", "--optimize"],
    "digits-int8": ["--convert", "export", "--precision", "int8-dynamic"],
    "digits-fp16": ["--convert", "torchscript-trace", "--precision", "fp16"],
    "digits-export": ["--convert", "export"],
}


def torchbay(*args: str) -> str:
    """Run ``python -m torchbay ARGS``; exit with its message on failure."""
    proc = subprocess.run(
        [sys.executable, "-m", "torchbay", *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"torchbay {args[0]} failed:\n{proc.stderr.strip()}")
    return proc.stdout


def archive(out: Path, store: Path, name: str, extra: list[str]) -> Path:
    torchbay(
        "archive",
        "--model-name",
        name,
        "--version",
        "1.0",
        "--serialized-file",
        str(out / "digits.pt"),
        "--model-file",
        str(out / "model.py"),
        "--handler",
        "image_classifier",
        "--extra-files",
        str(out / "index_to_name.json"),
        "--config-file",
        str(out / "model-config.yaml"),
        "--example-input",
        str(out / "example_input.pt"),
        "--export-path",
        str(store),
        "--force",
        *extra,
    )
    return store / f"{name}.mar"


def verify(mar: Path, sample: Path, digit: int) -> str:
    text = torchbay("verify", str(mar), "--input", str(sample))
    line = next(ln for ln in text.splitlines() if ln.startswith("output:"))
    scores = json.loads(line.split(":", 1)[1])
    top = max(scores, key=scores.get)
    if top != str(digit):
        sys.exit(f"{mar.name}: predicted {top} for {sample.name}, expected {digit}\n{text}")
    return f"{top} (p={scores[top]:.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out", help="training output folder")
    parser.add_argument("--store", type=Path, help="model store (default: OUT/model_store)")
    args = parser.parse_args()
    out: Path = args.out.resolve()
    store: Path = (args.store or out / "model_store").resolve()

    sys.path.insert(0, str(HERE))
    from train import train

    accuracy = train(out)
    print(f"trained the digits CNN: held-out accuracy {accuracy:.1%}; artifacts in {out}")
    if accuracy <= 0.9:
        sys.exit("accuracy too low")
    store.mkdir(parents=True, exist_ok=True)
    for i, (name, extra) in enumerate(VARIANTS.items()):
        mar = archive(out, store, name, extra)
        parity = torchbay("inspect", str(mar))
        parity_line = next(ln for ln in parity.splitlines() if ln.startswith("parity:"))
        digit = (3 + 2 * i) % 10
        got = verify(mar, out / f"sample_{digit}.png", digit)
        print(f"{mar}: {parity_line.split(':', 1)[1].strip()}")
        print(f"  verify sample_{digit}.png -> {got}")
    print(f"\nmodel store: {store}")
    print(f"sample images: {out}/sample_0.png .. sample_9.png")
    print(f"serve them:  torchbay serve --model-store {store} --models all  (see README)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
