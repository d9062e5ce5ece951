"""Record TorchServe 0.12's answers to the stateful example (sequence batching) as test data.

Run with TorchServe's environment, from this folder:
    /work/ts-venv/bin/python record.py OUT.json
It archives the example unchanged (plus lru.py, see README.md), starts TorchServe on ports
18100-18102 (gRPC 18105-18106), sends the requests below and writes every answer (status,
the sequence headers, body) and the model's description to OUT.json."""

import http.client
import json
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
COMMAND = "/work/ts-venv/bin/python tests/data/torchserve/stateful/record.py OUT.json"
BASE, MGMT = "http://127.0.0.1:18100", "http://127.0.0.1:18101"


def call(url, body=None, headers=None, method=None, timeout=30):
    """(status, headers, body); header names are sent as written (urllib would capitalize
    them, and TorchServe matches ``ts_request_sequence_id`` case-sensitively). Status 0: no
    connection yet; None: no answer within ``timeout`` seconds."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(
            method or ("POST" if body is not None else "GET"),
            parts.path,
            body=body,
            headers=headers or {},
        )
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    except ConnectionRefusedError:
        return 0, {}, ""
    except TimeoutError:
        return None, {}, f"no answer within {timeout} s"
    finally:
        conn.close()


def main(out):
    work = Path(tempfile.mkdtemp())
    sys.path.insert(0, str(HERE))
    from model import Net

    torch.manual_seed(0)
    torch.save(Net().state_dict(), work / "model_cnn.pt")
    store = work / "store"
    store.mkdir()
    archive = [
        "/work/ts-venv/bin/torch-model-archiver",
        "--model-name",
        "stateful",
        "--version",
        "1.0",
        "--model-file",
        str(HERE / "model.py"),
        "--serialized-file",
        str(work / "model_cnn.pt"),
        "--handler",
        str(HERE / "sequence_batching" / "stateful_handler.py"),
        "--extra-files",
        str(HERE / "lru.py"),
        "--config-file",
        str(HERE / "sequence_batching" / "model-config.yaml"),
        "--export-path",
        str(store),
    ]
    subprocess.run(archive, check=True)
    (work / "config.properties").write_text(
        "inference_address=http://127.0.0.1:18100\nmanagement_address=http://127.0.0.1:18101\n"
        "metrics_address=http://127.0.0.1:18102\ngrpc_inference_port=18105\n"
        "grpc_management_port=18106\n"
    )
    start = [
        "/work/ts-venv/bin/torchserve",
        "--start",
        "--ncs",
        "--disable-token-auth",
        "--model-store",
        str(store),
        "--models",
        "stateful=stateful.mar",
        "--ts-config",
        str(work / "config.properties"),
    ]
    subprocess.run(start, check=True, cwd=work)
    try:
        for _ in range(240):
            if (
                call(f"{MGMT}/models/stateful")[0] == 200
                and '"READY"' in call(f"{MGMT}/models/stateful")[2]
            ):
                break
            time.sleep(0.5)
        answers = []
        for n in (3, 1, 4):
            status, headers, body = call(
                f"{BASE}/predictions/stateful", str(n).encode(), {"ts_request_sequence_id": "seq_0"}
            )
            answers.append(
                {
                    "request": {"ts_request_sequence_id": "seq_0", "body": str(n)},
                    "status": status,
                    "body": body,
                    "headers": {k: v for k, v in headers.items() if "sequence" in k.lower()},
                }
            )
        status, headers, body = call(f"{BASE}/predictions/stateful", b"5")
        answers.append(
            {
                "request": {"body": "5"},
                "status": status,
                "body": body,
                "headers": {k: v for k, v in headers.items() if "sequence" in k.lower()},
            }
        )
        describe = json.loads(call(f"{MGMT}/models/stateful")[2])
        Path(out).write_text(
            json.dumps(
                {
                    "command": COMMAND,
                    "torchserve": "0.12",
                    "answers": answers,
                    "describe": describe,
                },
                indent=2,
            )
            + "\n"
        )
    finally:
        subprocess.run(["/work/ts-venv/bin/torchserve", "--stop"], cwd=work)


if __name__ == "__main__":
    main(sys.argv[1])
