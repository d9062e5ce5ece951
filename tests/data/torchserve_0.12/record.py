"""Record what TorchServe 0.12 answers to the parity sequence (sequence.py) into answers.json.

Run from the repository root, with TorchServe in its own virtualenv (Java 17 on PATH)::

    python3 -m venv /work/ts-venv
    /work/ts-venv/bin/pip install -c <(echo torch==2.13.0) torch==2.13.0 torchserve==0.12.0 \
        torch-model-archiver==0.12.0
    /work/ts-venv/bin/pip install pyyaml numpy  # TorchServe's backend imports them
    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python tests/data/torchserve_0.12/record.py

It builds the archives with torch-model-archiver in a temporary folder, starts TorchServe there
(``--foreground --ncs --disable-token-auth --enable-model-api``, free ports, Prometheus metrics,
no system metrics), runs every step in order and stops it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "torchserve")]  # sequence, tsrun
import sequence  # noqa: E402
import tsrun  # noqa: E402

COMMAND = tsrun.recorder_command(__file__)


def run_step(bases: dict[str, str], step: dict) -> dict:
    deadline = time.monotonic() + 60
    url = bases[step["listener"]] + step["path"]
    while True:
        status, ctype, raw = tsrun.call(url, step["method"], step.get("body"))
        body = sequence.normalise(step, ctype, raw)
        if step.get("until") != "ready" or sequence.ready(body) or time.monotonic() > deadline:
            print(step["id"], status, flush=True)
            return {"id": step["id"], "status": status, "body": body}
        time.sleep(0.5)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-parity-"))
    store = tsrun.build_store(work, sequence.ARCHIVES, HERE)
    (store / sequence.NOT_AN_ARCHIVE).write_text("this is not a model archive\n")
    bases = {name: f"http://127.0.0.1:{tsrun.free_port()}" for name in tsrun.LISTENERS}
    config = {f"{name}_address": base for name, base in bases.items()}
    config.update(metrics_mode="prometheus", disable_system_metrics="true")
    config.update(install_py_dep_per_model="false")
    argv = tsrun.command(store, tsrun.properties(work / "config.properties", config))
    with tsrun.running(argv, work, tsrun.pinged(bases["inference"])):
        answers = [run_step(bases, step) for step in sequence.STEPS]
    tsrun.write_answers(HERE, COMMAND, answers, work)


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
