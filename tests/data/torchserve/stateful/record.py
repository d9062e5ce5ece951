"""Record TorchServe 0.12's answers to the stateful example (sequence batching) as test data.

Run with TorchServe's environment, from this folder:
    /work/ts-venv/bin/python record.py OUT.json
It archives the example unchanged (plus lru.py, see README.md), starts TorchServe on ports
18100-18102 (gRPC 18105-18106), sends the requests below and writes every answer (status,
the sequence headers, body) and the model's description to OUT.json."""

import http.client
import json
import sys
import tempfile
import urllib.parse
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
# TorchServe's stateful example, copied unchanged (this folder holds our lru.py and records).
EXAMPLE = HERE.parents[2] / "third_party" / "torchserve" / "stateful"
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

COMMAND = "/work/ts-venv/bin/python tests/data/torchserve/stateful/record.py OUT.json"
BASE, MGMT = "http://127.0.0.1:18100", "http://127.0.0.1:18101"
PORTS = (18100, 18101, 18102, 18105, 18106)


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


def build_store(work):
    sys.path.insert(0, str(EXAMPLE))
    from model import Net

    torch.manual_seed(0)
    torch.save(Net().state_dict(), work / "model_cnn.pt")
    store = work / "store"
    store.mkdir()
    tsrun.archive(
        "stateful",
        EXAMPLE / "sequence_batching" / "stateful_handler.py",
        store,
        "--model-file",
        str(EXAMPLE / "model.py"),
        "--serialized-file",
        str(work / "model_cnn.pt"),
        "--extra-files",
        str(HERE / "lru.py"),
        "--config-file",
        str(EXAMPLE / "sequence_batching" / "model-config.yaml"),
    )
    return store


def model_ready():
    status, _, body = call(f"{MGMT}/models/stateful")
    return status == 200 and '"READY"' in body


def answer(request, status, headers, body):
    sequence = {k: v for k, v in headers.items() if "sequence" in k.lower()}
    return {"request": request, "status": status, "body": body, "headers": sequence}


def main(out):
    work = Path(tempfile.mkdtemp())
    store = build_store(work)
    config = {"inference_address": BASE, "management_address": MGMT}
    config.update(metrics_address="http://127.0.0.1:18102")
    config.update(grpc_inference_port="18105", grpc_management_port="18106")
    config_path = tsrun.properties(work / "config.properties", config)
    argv = tsrun.command(store, config_path, "--models", "stateful=stateful.mar")
    with tsrun.running(argv, work, model_ready, ports=PORTS):
        answers = []
        for n in (3, 1, 4):
            sequence = {"ts_request_sequence_id": "seq_0"}
            reply = call(f"{BASE}/predictions/stateful", str(n).encode(), sequence)
            answers.append(answer({**sequence, "body": str(n)}, *reply))
        reply = call(f"{BASE}/predictions/stateful", b"5")
        answers.append(answer({"body": "5"}, *reply))
        describe = json.loads(call(f"{MGMT}/models/stateful")[2])
    record = {"command": COMMAND, "torchserve": "0.12", "answers": answers, "describe": describe}
    Path(out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
