"""Record how TorchServe 0.12, on a host without a GPU, takes the ways an operator declares
devices (answers.json): ``number_of_gpu`` in config.properties, and model-config.yaml's
``deviceType`` and ``deviceIds`` (well formed, out of range, not a list, unknown).

Run from the repository root, TorchServe in its own virtualenv (Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python tests/data/torchserve/devices/record.py

It builds one archive per case (``devices_handler.py`` over a tiny TorchScript model, the case's
model-config.yaml) with torch-model-archiver, starts TorchServe once on ports 18600-18602 with
``number_of_gpu=2`` (``--foreground --ncs --disable-token-auth --enable-model-api``), registers
each archive synchronously with one worker, predicts once, records the registration's status,
describe's ``deviceType``, ``deviceIds`` and the worker's ``gpu`` flag, and what the handler saw,
and stops it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

PORTS = {"inference": 18600, "management": 18601, "metrics": 18602}
# (model name, model-config.yaml or None)
CASES = [
    ("plain", None),
    ("gpu", "deviceType: gpu\n"),
    ("upper", "deviceType: GPU\n"),
    ("tpu", "deviceType: tpu\n"),
    ("ids_pair", "deviceIds: [1, 0]\n"),
    ("ids_out", "deviceIds: [5]\n"),
    ("ids_scalar", "deviceIds: 1\n"),
    ("ids_text", "deviceIds: '0,1'\n"),
    ("ids_words", "deviceIds: [a]\n"),
]


def build_store(work: Path) -> Path:
    store = work / "store"
    store.mkdir()
    serialized = ("--serialized-file", str(tsrun.scripted_linear(work)))
    for name, yaml in CASES:
        extra = list(serialized)
        if yaml is not None:
            (work / f"{name}.yaml").write_text(yaml)
            extra += ["--config-file", str(work / f"{name}.yaml")]
        tsrun.archive(name, HERE / "devices_handler.py", store, *extra)
    return store


def body(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def ask(name: str) -> dict:
    mgmt = f"http://127.0.0.1:{PORTS['management']}"
    url = f"{mgmt}/models?url={name}.mar&initial_workers=1&synchronous=true"
    status, _, raw = tsrun.call(url, "POST")
    answer: dict = {"model": name, "register": status, "register_body": body(raw)}
    if status != 200:
        return answer
    _, _, raw = tsrun.call(f"{mgmt}/models/{name}", "GET")
    [described] = json.loads(raw)
    answer["workers_gpu"] = [w["gpu"] for w in described["workers"]]
    answer["described"] = {key: described.get(key) for key in ("deviceType", "deviceIds")}
    predicted = f"http://127.0.0.1:{PORTS['inference']}/predictions/{name}"
    status, _, raw = tsrun.call(predicted, "POST", b"{}", "application/json")
    answer["predict"] = status
    answer["handler_saw"] = body(raw)
    return answer


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-devices-"))
    store = build_store(work)
    config = {f"{k}_address": f"http://127.0.0.1:{port}" for k, port in PORTS.items()}
    config.update(number_of_gpu="2", disable_system_metrics="true")
    config.update(grpc_inference_port="18603", grpc_management_port="18604")
    argv = tsrun.command(store, tsrun.properties(work / "config.properties", config))
    ready = tsrun.pinged(f"http://127.0.0.1:{PORTS['inference']}")
    with tsrun.running(argv, work, ready, ports=tuple(PORTS.values())):
        answers = [ask(name) for name, _ in CASES]
    record = {
        "made_by": tsrun.recorder_command(__file__),
        "torchserve": tsrun.torchserve_version(),
        "host": "no GPU (torch.cuda.is_available() is False, no nvidia-smi)",
        "config": {"number_of_gpu": "2"},
        "cases": [{"model": n, "model_config": y} for n, y in CASES],
        "answers": answers,
    }
    tsrun.write_json(HERE / "answers.json", record)


if __name__ == "__main__":
    main()
