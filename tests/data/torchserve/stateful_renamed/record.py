"""Record what TorchServe 0.12 does with ``ts_header_key_sequence_id`` / ``_start`` / ``_end``
(config.properties keys that rename the sequence headers) as test data.

Run with TorchServe's environment, from the repository root:
    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \
        tests/data/torchserve/stateful_renamed/record.py \
        tests/data/torchserve/stateful_renamed/torchserve_0.12.json
It archives ``seen_handler.py`` (it answers the sequence id its context reads, the context's
header keys and the request's sequence headers) with ``model-config.yaml`` (one worker, a
sequence model), starts TorchServe twice with the keys renamed to ``session-id`` /
``session-start`` / ``session-end`` -- once alone, once with the worker's environment variables
``TS_REQUEST_SEQUENCE_ID`` / ``_START`` / ``_END`` set to the same names (ts/context.py reads
them) -- sends the requests of ``REQUESTS`` and writes every answer (status, the response's
sequence headers, body) to the output file."""

import contextlib
import http.client
import json
import sys
import tempfile
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

COMMAND = (
    "PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python "
    "tests/data/torchserve/stateful_renamed/record.py OUT.json"
)
BASE, MGMT = "http://127.0.0.1:18110", "http://127.0.0.1:18111"
PORTS = (18110, 18111, 18112, 18115, 18116)
KEYS = {
    "ts_header_key_sequence_id": "session-id",
    "ts_header_key_sequence_start": "session-start",
    "ts_header_key_sequence_end": "session-end",
}
ENV = {
    "TS_REQUEST_SEQUENCE_ID": "session-id",
    "TS_REQUEST_SEQUENCE_START": "session-start",
    "TS_REQUEST_SEQUENCE_END": "session-end",
}
# (request headers, body): header names are sent as written (TorchServe matches them
# case-sensitively).
REQUESTS = [
    ({}, "a"),
    ({"session-id": "s1"}, "b"),
    ({"session-id": "s1"}, "c"),
    ({"ts_request_sequence_id": "s2"}, "d"),
    ({"session-id": "s1", "session-end": "true"}, "e"),
]


def call(url, body=None, headers=None, timeout=60):
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(
            "POST" if body is not None else "GET", parts.path, body=body, headers=headers or {}
        )
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    except ConnectionRefusedError:
        return 0, {}, ""
    finally:
        conn.close()


def model_ready():
    status, _, body = call(f"{MGMT}/models/seen")
    return status == 200 and '"READY"' in body


def run(work, store, env):
    work.mkdir()  # a folder per run: TorchServe's pid file stays behind in the last one's
    config = {"inference_address": BASE, "management_address": MGMT, **KEYS}
    config.update(metrics_address="http://127.0.0.1:18112")
    config.update(grpc_inference_port="18115", grpc_management_port="18116")
    config_path = tsrun.properties(work / "config.properties", config)
    argv = tsrun.command(store, config_path, "--models", "seen=seen.mar")
    answers = []
    with tsrun.running(argv, work, model_ready, ports=PORTS, env=env):
        for headers, body in REQUESTS:
            status, got, text = call(f"{BASE}/predictions/seen", body.encode(), headers)
            sequence = {k: v for k, v in got.items() if "seq" in k.lower() or "session" in k}
            with contextlib.suppress(ValueError):
                text = json.loads(text)
            answers.append(
                {
                    "request": {"headers": headers, "body": body},
                    "status": status,
                    "headers": sequence,
                    "body": text,
                }
            )
    return answers


def main(out):
    work = Path(tempfile.mkdtemp())
    (work / "model.pt").write_bytes(b"")
    store = work / "store"
    store.mkdir()
    tsrun.archive(
        "seen",
        HERE / "seen_handler.py",
        store,
        "--serialized-file",
        str(work / "model.pt"),
        "--config-file",
        str(HERE / "model-config.yaml"),
    )
    record = {
        "command": COMMAND,
        "torchserve": tsrun.torchserve_version(),
        "config": KEYS,
        "keys_only": run(work / "keys", store, {}),
        "with_env": ENV,
    }
    record["with_env_answers"] = run(work / "env", store, ENV)
    Path(out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
