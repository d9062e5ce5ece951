"""TorchServe's own Postman management collection (test/postman/management_api_test_collection.json
and management_data.json of TorchServe 0.12, copied unchanged to
tests/third_party/torchserve/postman/), replayed row by row as newman runs it: each row's ``METHOD``
(upper-cased, as newman sends it) on the management address plus its ``path``, its ``{{variables}}``
from the collection's environment.json, one request at a time, in order. The collection checks the
status code only (``status_code``, 200 when absent); this records the body too.

Recorded against TorchServe 0.12 (this machine, no internet: the rows that register from
torchserve.pytorch.org cannot download) with::

    python tests/server/postman_replay.py record --torchserve /work/ts-venv/bin/torchserve \\
        --out tests/data/torchserve/postman/management_ts012.json

which builds the stand-in archives (``build_zoo``: a tiny TorchScript image classifier under each
name the collection registers, archived by TorchServe's own torch-model-archiver when
``--archiver`` is given, else by ours), starts TorchServe on ports 18601-18603 with
``--disable-token-auth --ncs`` and ``enable_model_api=true``, replays, and stops it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

# TorchServe's collections, copied unchanged (COLLECTIONS), and our records of its answers (DATA).
COLLECTIONS = Path(__file__).resolve().parents[1] / "third_party" / "torchserve" / "postman"
DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "postman"
# The archives the management collection registers (environment.json's mar_path_* values).
ZOO = ("mnist", "squeezenet1_1", "densenet161", "resnet-152-batch", "resnet-18")


def environment() -> dict[str, str]:
    values = json.loads((COLLECTIONS / "environment.json").read_text())["values"]
    return {v["key"]: str(v["value"]) for v in values if v.get("enabled", True)}


def rows() -> list[dict[str, Any]]:
    return json.loads((COLLECTIONS / "management_data.json").read_text())


def substitute(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\{\{([^}]+)\}\}", lambda m: env.get(m.group(1), m.group(0)), text)


def replay(management: str, timeout: float = 180.0) -> list[dict[str, Any]]:
    """Every row against ``management`` (``http://host:port``): its request, the status the
    collection expects, and the answer (status and body, the body cut at 300 characters)."""
    env = environment()
    out = []
    with httpx.Client(timeout=timeout) as client:
        for index, row in enumerate(rows()):
            method = row["METHOD"].upper()
            path = substitute(row["path"], env)
            reply = client.request(method, f"{management}/{path}")
            out.append(
                {
                    "row": index,
                    "type": row.get("type"),
                    "request": f"{method} /{path}",
                    "expected": int(row.get("status_code", 200)),
                    "status": reply.status_code,
                    "body": reply.text[:300],
                }
            )
    return out


def build_zoo(out: Path, archiver: str | None = None, names: tuple[str, ...] = ZOO) -> Path:
    """The stand-ins: one tiny TorchScript image classifier (3xHxW -> 10 classes), archived
    under each of ``names`` with the built-in ``image_classifier`` handler."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 5, stride=8),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 10),
    ).eval()
    model = out / "tiny.pt"
    torch.jit.script(net).save(str(model))
    for name in names:
        if archiver is not None:
            cmd = [archiver, "--model-name", name, "--version", "1.0", "--force"]
            cmd += ["--serialized-file", str(model), "--handler", "image_classifier"]
            subprocess.run([*cmd, "--export-path", str(out)], check=True)
        else:
            from torchbay.archiver.package import ArchiveOptions, package

            options = ArchiveOptions(
                model_name=name,
                version="1.0",
                serialized_file=model,
                handler="image_classifier",
                export_path=out,
                force=True,
            )
            package(options)
    model.unlink()
    return out


def record(torchserve: str, out: Path, archiver: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = build_zoo(Path(tmp, "store"), archiver)
        config = Path(tmp, "config.properties")
        config.write_text(
            "inference_address=http://127.0.0.1:18601\nmanagement_address=http://127.0.0.1:18602\n"
            "metrics_address=http://127.0.0.1:18603\nenable_model_api=true\n"
        )
        cmd = [torchserve, "--start", "--ncs", "--disable-token-auth", "--model-store", str(store)]
        subprocess.run([*cmd, "--ts-config", str(config)], check=True, cwd=tmp)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if httpx.get("http://127.0.0.1:18602/models", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
            answers = replay("http://127.0.0.1:18602")
        finally:
            subprocess.run([torchserve, "--stop"], cwd=tmp, check=False)
    command = "python tests/server/postman_replay.py record --torchserve ... (TorchServe 0.12)"
    out.write_text(json.dumps({"command": command, "answers": answers}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--torchserve", required=True)
    rec.add_argument("--archiver", help="TorchServe's torch-model-archiver (default: ours)")
    rec.add_argument("--out", type=Path, default=DATA / "management_ts012.json")
    args = parser.parse_args()
    record(args.torchserve, args.out, args.archiver)


if __name__ == "__main__":
    sys.exit(main())
