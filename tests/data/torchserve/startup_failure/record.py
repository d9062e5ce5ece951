"""Record what TorchServe 0.12's health check (``/ping``) and describe answer while a start-up
model's workers fail to load (answers.json): ``broken.mar`` (``broken_handler.py``: its
initialization raises) started with ``--models``, alone and beside ``ok.mar``
(``ok_handler.py``), each with ``model-config.yaml`` (one worker, ``maxRetryTimeoutInSec: 5``);
each run's ``/ping``, worker statuses and ok's answer to a prediction read at once and
every few seconds for 40 s. TorchServe's ``/ping`` counts a worker healthy until it has been
failing for ``maxRetryTimeoutInSec`` (``WorkerThread.isHealthy``), so it turns Unhealthy then.

Run from the repository root, TorchServe in its own virtualenv (Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \\
        tests/data/torchserve/startup_failure/record.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

PORTS = {"inference": 18590, "management": 18591, "metrics": 18592}
READS_AT_S = (0, 5, 10, 20, 40)


def read(base: str, management: str) -> dict:
    status, _, body = tsrun.call(base + "/ping", "GET")
    models = json.loads(tsrun.call(management + "/models", "GET")[2])["models"]
    workers, predicted = {}, {}
    for model in models:
        name = model["modelName"]
        described = json.loads(tsrun.call(f"{management}/models/{name}", "GET")[2])
        workers[name] = [w["status"] for w in described[0]["workers"]]
        if name == "ok":  # past its retry window broken's request waits for ever: not asked
            predicted[name] = tsrun.call(f"{base}/predictions/{name}", "POST", b"x")[0]
    return {"ping": [status, json.loads(body)], "workers": workers, "predictions": predicted}


def run(models: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        for name in models:
            config_file = ("--config-file", str(HERE / "model-config.yaml"))
            tsrun.archive(name, HERE / f"{name}_handler.py", store, *config_file)
        config = {f"{k}_address": f"http://127.0.0.1:{port}" for k, port in PORTS.items()}
        config["disable_system_metrics"] = "true"
        properties = tsrun.properties(work / "config.properties", config)
        listed = ",".join(f"{name}={name}.mar" for name in models)
        argv = tsrun.command(store, properties, "--models", listed)
        base = f"http://127.0.0.1:{PORTS['inference']}"
        management = f"http://127.0.0.1:{PORTS['management']}"
        out = []
        with tsrun.running(argv, work, tsrun.pinged(base), ports=list(PORTS.values())):
            start = time.monotonic()
            for at in READS_AT_S:
                time.sleep(max(0.0, start + at - time.monotonic()))
                out.append({"seconds": at, **read(base, management)})
    return out


def main() -> None:
    tsrun.write_record(
        HERE,
        tsrun.recorder_command(__file__),
        broken_alone=run(["broken"]),
        broken_beside_ok=run(["broken", "ok"]),
    )


if __name__ == "__main__":
    main()
