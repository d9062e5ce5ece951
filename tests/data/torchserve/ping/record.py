"""Record what TorchServe 0.12's health check (``/ping``) answers while a model's workers load or
fail to load (answers.json), in two runs of TorchServe, each with its own store:

* ``startup_failure``: ``broken.mar`` (``broken_handler.py``: its initialization raises) started
  with ``--models``, alone and beside ``ok.mar`` (``ok_handler.py``), both packed with
  ``model-config.yaml`` (one worker, ``maxRetryTimeoutInSec: 5``); ``/ping``, the workers'
  statuses and ok's answer to a prediction read at once and at 5, 10, 20 and 40 s;
* ``loading``: no start-up model; ``slow.mar`` (``slow_handler.py``: its initialization takes
  15 s) registered with one worker without waiting, then scaled to two without waiting,
  ``/ping`` asked at once and once the workers are READY.

Run from the repository root, TorchServe in its own virtualenv (Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python tests/data/torchserve/ping/record.py
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

PORT = 18590  # inference; management and metrics take the next two
READS_AT_S = (0, 5, 10, 20, 40)
CONFIG_FILE = ("--config-file", str(HERE / "model-config.yaml"))


@contextlib.contextmanager
def torchserve(archives: dict[str, tuple[str, ...]], *extra: str) -> Iterator[tuple[str, str]]:
    """TorchServe over a store of ``archives`` (name -> torch-model-archiver's other flags), on
    PORT and the next two, started with ``extra``: (inference URL, management URL)."""
    with tempfile.TemporaryDirectory() as tmp:
        work, urls = Path(tmp), [f"http://127.0.0.1:{PORT + i}" for i in range(3)]
        (work / "store").mkdir()
        for name, flags in archives.items():
            tsrun.archive(name, HERE / f"{name}_handler.py", work / "store", *flags)
        settings = {
            f"{listener}_address": url for listener, url in zip(tsrun.LISTENERS, urls, strict=True)
        }
        properties = tsrun.properties(
            work / "config.properties", {**settings, "disable_system_metrics": "true"}
        )
        argv = tsrun.command(work / "store", properties, *extra)
        ports = [PORT, PORT + 1, PORT + 2]
        with tsrun.running(argv, work, tsrun.pinged(urls[0]), ports=ports):
            yield urls[0], urls[1]


def ping(base: str) -> list:
    status, _, body = tsrun.call(base + "/ping", "GET")
    return [status, json.loads(body)]


def statuses(management: str, name: str) -> list[str]:
    described = json.loads(tsrun.call(f"{management}/models/{name}", "GET")[2])
    return [w["status"] for w in described[0]["workers"]]


def startup_failure(models: list[str]) -> list[dict]:
    listed = ",".join(f"{name}={name}.mar" for name in models)
    out = []
    with torchserve(dict.fromkeys(models, CONFIG_FILE), "--models", listed) as (base, mgmt):
        start = time.monotonic()
        for at in READS_AT_S:
            time.sleep(max(0.0, start + at - time.monotonic()))
            read = {"seconds": at, "ping": ping(base)}
            read["workers"] = {name: statuses(mgmt, name) for name in models}
            if "ok" in models:  # past its retry window broken's request waits for ever: not asked
                read["ok"] = tsrun.call(f"{base}/predictions/ok", "POST", b"x")[0]
            out.append(read)
    return out


def until_ready(management: str, count: int) -> list[str]:
    deadline = time.monotonic() + 120
    while statuses(management, "slow") != ["READY"] * count:
        if time.monotonic() > deadline:
            raise SystemExit("the workers did not load")
        time.sleep(0.5)
    return statuses(management, "slow")


def loading() -> list[dict]:
    out = []
    with torchserve({"slow": ()}) as (base, mgmt):
        for count, call in enumerate(
            [
                ("POST", "/models?url=slow.mar&initial_workers=1&synchronous=false"),
                ("PUT", "/models/slow?min_worker=2"),
            ],
            start=1,
        ):
            status, _, body = tsrun.call(mgmt + call[1], call[0])
            out.append({"call": " ".join(call), "answer": [status, json.loads(body)]})
            out.append({"at once": ping(base), "workers": statuses(mgmt, "slow")})
            workers = until_ready(mgmt, count)
            out.append({"loaded": ping(base), "workers": workers})
    return out


def main() -> None:
    tsrun.write_record(
        HERE,
        tsrun.recorder_command(__file__),
        startup_failure={
            "broken_alone": startup_failure(["broken"]),
            "broken_beside_ok": startup_failure(["broken", "ok"]),
        },
        loading=loading(),
    )


if __name__ == "__main__":
    main()
