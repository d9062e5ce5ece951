"""Record how TorchServe 0.12 answers each kind of result a handler returns (answers.json):
results_handler.py, packed by torch-model-archiver and loaded at start-up, asked every kind of
cases.py through ``/predictions/results``. Run from the repository root (one command):

    PATH=/work/ts-venv/bin:$PATH \\
        /work/ts-venv/bin/python tests/data/torchserve/result_types/record.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # cases, tsrun
import cases  # noqa: E402
import tsrun  # noqa: E402


def _loaded(port: int) -> None:
    """Wait until the model answers (404 or 503 while its worker loads)."""
    deadline = time.monotonic() + 300
    while cases.ask(port, "str")["status"] in (404, 503):
        if time.monotonic() > deadline:
            raise SystemExit("the model did not load")
        time.sleep(0.5)


def main() -> None:
    archives = {"results.mar": ("results", "1.0", "results_handler.py")}
    config = {"load_models": "all", "default_workers_per_model": "1"}
    with tsrun.served("ts-results-", archives, HERE, **config) as (work, bases):
        port = urlsplit(bases["inference"]).port
        _loaded(port)
        answers = [{"id": kind, **cases.ask(port, kind)} for kind in cases.KINDS]
    tsrun.write_answers(HERE, tsrun.recorder_command(__file__), answers, work)


if __name__ == "__main__":
    main()
