"""Record what TorchServe 0.12 answers to cases.py's requests (and what a customized describe
writes to model_metrics.log) into answers.json. Run from the repository root, as README.md says.

It builds cases.ARCHIVES with torch-model-archiver from echo_handler.py over a tiny TorchScript
model, starts TorchServe (``tsrun.served``: ``--foreground --ncs --disable-token-auth
--enable-model-api``, free ports) with every archive loaded at start-up (one worker each) and
TorchServe's default metrics mode (``log``; no system metrics), describes echo with
``customized=true`` first (what the metrics logs then hold), then asks every case.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # cases, tsrun
import cases  # noqa: E402
import tsrun  # noqa: E402


def _ready(management: str, names: list[str]) -> None:
    deadline = time.monotonic() + 300
    for name in names:
        while True:
            status, body = tsrun.json_call("GET", f"{management}/models/{name}", None)
            workers = body[0]["workers"] if status == 200 else []
            if any(w["status"] == "READY" for w in workers):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{name} has no READY worker")
            time.sleep(0.5)


def _metric_lines(log: Path) -> list[str]:
    return cases.metric_lines(log.read_text()) if log.exists() else []


def main() -> None:
    config = dict(load_models="all", default_workers_per_model="1")
    config.update(install_py_dep_per_model="false", disable_system_metrics="true")
    with tsrun.served("ts-methods-", cases.ARCHIVES, HERE, **config) as (work, bases):
        _ready(bases["management"], [m for m, _, _ in cases.ARCHIVES.values()])
        logs = work / "logs"
        before = _metric_lines(logs / "ts_metrics.log")
        status, described = tsrun.json_call(
            "GET", f"{bases['management']}/models/echo?customized=true", None
        )
        time.sleep(2)  # the backend's metric lines reach the log after the answer
        describe = {
            "status": status,
            "customizedMetadata": described[0].get("customizedMetadata"),
            "model_metrics": _metric_lines(logs / "model_metrics.log"),
            "ts_metrics_added": _metric_lines(logs / "ts_metrics.log")[len(before) :],
        }
        answers = {"describe_customized": describe, "cases": cases.run(bases)}
    tsrun.write_answers(HERE, tsrun.recorder_command(__file__), answers, work)


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
