"""Record what TorchServe 0.12 answers to scenario.py into answers.json.

Run from the repository root, TorchServe in its own virtualenv (Java 17 on PATH), as README.md
says (``tsrun.recorder_command`` writes that command into answers.json).

It builds ``scenario.ARCHIVES`` with torch-model-archiver from ../busy/gate_handler.py over a
tiny TorchScript model, starts TorchServe in a folder of its own (``--foreground --ncs
--disable-token-auth --enable-model-api``, free ports, Prometheus metrics, no system metrics,
``unregister_model_timeout`` at ``scenario.UNREGISTER_TIMEOUT_S``), runs the scenario and stops it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "torchserve")]  # scenario, tsrun
import scenario  # noqa: E402
import tsrun  # noqa: E402

COMMAND = tsrun.recorder_command(__file__)


def call(method: str, url: str, body: bytes | None) -> tuple[int, Any]:
    status, _, raw = tsrun.call(url, method, body, "application/json")
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-answers-"))
    store = tsrun.build_store(work, scenario.ARCHIVES, HERE)
    bases = {name: f"http://127.0.0.1:{tsrun.free_port()}" for name in tsrun.LISTENERS}
    config = {f"{name}_address": base for name, base in bases.items()}
    config.update(metrics_mode="prometheus", disable_system_metrics="true")
    config.update(install_py_dep_per_model="false")
    config.update(unregister_model_timeout=str(scenario.UNREGISTER_TIMEOUT_S))
    argv = tsrun.command(store, tsrun.properties(work / "config.properties", config))
    gates = work / "gates"
    gates.mkdir()
    with tsrun.running(argv, work, tsrun.pinged(bases["inference"])):
        answers = scenario.run(
            call, bases["inference"], bases["management"], bases["metrics"], gates
        )
    tsrun.write_answers(HERE, COMMAND, answers, work)


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
