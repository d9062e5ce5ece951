"""The whole first run: train and archive the digits CNN, serve it, and ask for a prediction.

    .venv/bin/python examples/digits/demo.py [--keep-running]

1. ``examples/digits/build.py`` trains on scikit-learn's bundled digits, archives four variants
   (fp32 TorchScript, int8, fp16, torch.export) and verifies each;
2. ``torchbay serve`` starts with the fp32 and int8 archives, every listener (HTTP and gRPC) on
   a free local port, so a server already on the host (or TorchServe) cannot be in its way;
3. a sample PNG is POSTed to ``/predictions/digits`` (with the inference key the server wrote);
4. it prints the prediction and where the metrics, management and gRPC APIs are, then stops the
   server (or keeps it running with ``--keep-running`` until Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
READY = "ready.json"  # in the server's run directory: its ports, once every model loaded


def free_grpc_ports(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the server's gRPC listeners on free ports: the CLI has no flag for them and
    their defaults are TorchServe's fixed 7070/7071 (``TORCHBAY_<setting>`` beats a
    config.properties and the defaults, see server/config/sources.py)."""
    return {**env, "TORCHBAY_GRPC_INFERENCE_PORT": "0", "TORCHBAY_GRPC_MANAGEMENT_PORT": "0"}


def start_server(store: Path, run_dir: Path, models: Sequence[str]) -> subprocess.Popen[bytes]:
    """``torchbay serve`` over ``store`` in ``run_dir`` (its key file and ready file go there),
    loading ``models`` (none: an empty server), every listener on a free local port."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchbay",
            "serve",
            "--ncs",  # exactly the models named here, not a snapshot of a run before
            "--model-store",
            str(store),
            *(["--models", *models] if models else []),
            "--inference-address",
            "http://127.0.0.1:0",
            "--management-address",
            "http://127.0.0.1:0",
            "--metrics-address",
            "http://127.0.0.1:0",
            "--ready-file",
            str(run_dir / READY),
        ],
        cwd=run_dir,
        env=free_grpc_ports(os.environ),
    )


def wait_ready(server: subprocess.Popen[bytes], ready: Path, timeout: float = 120) -> Any:
    """The ports the server wrote to ``ready`` once its models loaded (the ready file's JSON),
    or None when it exited or took longer than ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.1)
    return json.loads(ready.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-running", action="store_true", help="leave the server up")
    args = parser.parse_args()

    out = HERE / "out"
    store = out / "model_store"
    subprocess.run(
        [sys.executable, str(HERE / "build.py"), "--out", str(out), "--store", str(store)],
        check=True,
    )

    run_dir = Path(tempfile.mkdtemp(prefix="torchbay-demo-"))
    models = ("digits=digits.mar", "digits-int8=digits-int8.mar")
    print("\nstarting: torchbay serve --model-store", store, "--models", *models, "...")
    server = start_server(store, run_dir, models)
    try:
        ports = wait_ready(server, run_dir / READY)
        if ports is None:
            print("the server did not start", file=sys.stderr)
            return 1
        headers = {}
        key_file = run_dir / "key_file.json"
        if key_file.exists():  # token auth is on by default
            key = json.loads(key_file.read_text())["inference"]["key"]
            headers["Authorization"] = f"Bearer {key}"
        base = f"http://127.0.0.1:{ports['inference']}"
        for model in ("digits", "digits-int8"):
            sample = out / "sample_7.png"
            reply = httpx.post(
                f"{base}/predictions/{model}",
                content=sample.read_bytes(),
                headers={**headers, "content-type": "image/png"},
                timeout=30,
            )
            reply.raise_for_status()
            top = max(reply.json().items(), key=lambda kv: kv[1])
            print(f"\nPOST {base}/predictions/{model} < {sample.name}")
            print(f"  -> {reply.text}")
            print(f"  predicted digit {top[0]} (p={top[1]:.3f}); the image shows a 7")
        print(f"\nmetrics (Prometheus):  curl http://127.0.0.1:{ports['metrics']}/metrics")
        mgmt = f"http://127.0.0.1:{ports['management']}"
        auth_hint = ""
        if key_file.exists():
            auth_hint = f" -H 'Authorization: Bearer <management key in {key_file}>'"
        print(f"management API:        curl{auth_hint} {mgmt}/models/digits")
        grpc = f"inference 127.0.0.1:{ports['grpc_inference']}, management "
        print(f"gRPC:                  {grpc}127.0.0.1:{ports['grpc_management']}")
        if args.keep_running:
            print("\nserver running; Ctrl-C to stop")
            server.wait()
        else:
            print("(stopping the server now; `bash scripts/demo.sh --keep-running` leaves it up)")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    raise SystemExit(main())
