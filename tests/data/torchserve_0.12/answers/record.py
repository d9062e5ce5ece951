"""Record what TorchServe 0.12 answers to scenario.py into answers.json.

Run from the repository root, TorchServe in its own virtualenv (Java 17 on PATH), as README.md
says (``tsrun.recorder_command`` writes that command into answers.json).

It builds ``scenario.ARCHIVES`` with torch-model-archiver from ../busy/gate_handler.py over a
tiny TorchScript model, starts TorchServe in a folder of its own (``--foreground --ncs
--disable-token-auth --enable-model-api``, free ports, Prometheus metrics, no system metrics,
``unregister_model_timeout`` at ``scenario.UNREGISTER_TIMEOUT_S``), runs the scenario and stops it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "torchserve")]  # scenario, tsrun
import scenario  # noqa: E402
import tsrun  # noqa: E402


def main() -> None:
    config = dict(metrics_mode="prometheus", disable_system_metrics="true")
    config.update(install_py_dep_per_model="false")
    config.update(unregister_model_timeout=str(scenario.UNREGISTER_TIMEOUT_S))
    with tsrun.served("ts-answers-", scenario.ARCHIVES, HERE, **config) as (work, bases):
        (work / "gates").mkdir()
        urls = bases["inference"], bases["management"], bases["metrics"]
        answers = scenario.run(tsrun.json_call, *urls, work / "gates")
    tsrun.write_answers(HERE, tsrun.recorder_command(__file__), answers, work)


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
