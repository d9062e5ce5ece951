"""Record what TorchServe 0.12 answers to busy.py's scenario into answers.json.

Run from the repository root, TorchServe in its own virtualenv (Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python tests/data/torchserve_0.12/busy/record.py

It builds the archives of ``busy.ARCHIVES`` with torch-model-archiver from gate_handler.py over a
tiny TorchScript model, starts TorchServe in a folder of its own (``--foreground --ncs
--disable-token-auth --enable-model-api``, free ports, no system metrics), runs the scenario and
stops it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "torchserve")]  # busy, tsrun
import busy  # noqa: E402
import tsrun  # noqa: E402


def main() -> None:
    config = dict(disable_system_metrics="true", install_py_dep_per_model="false")
    with tsrun.served("ts-busy-", busy.ARCHIVES, HERE, **config) as (work, bases):
        (work / "gates").mkdir()
        answers = busy.run(tsrun.json_call, bases["inference"], bases["management"], work / "gates")
    tsrun.write_answers(HERE, tsrun.recorder_command(__file__), answers, work)


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
