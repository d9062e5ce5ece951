"""Record which families and samples TorchServe 0.12's /metrics answers for each ``name[]``
filter of ``QUERIES`` (after one prediction through filter_handler.py, metrics.yaml as the
metrics_config, prometheus mode) into answers.json.

Run from the repository root, TorchServe in its own virtualenv (tests/data/torchserve_0.12/
record.py says how it was installed; Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \\
        tests/data/torchserve/metrics_filter/record.py

TorchServe runs in a fresh folder on ports 18620-18624 (``--foreground --ncs
--disable-token-auth --enable-model-api``, no system metrics).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]
import tsrun  # noqa: E402

COMMAND = tsrun.recorder_command(__file__)
QUERIES = (
    "",
    "?name[]=LatH",
    "?name[]=LatH_bucket",
    "?name[]=LatH_count&name[]=Requests2XX",
    "?name[]=Requests4XX",
    "?name[]=Requests4XX&name[]=LatH_sum",
    "?name[]=Requests2XX_total",
)
PORTS = {"inference": 18620, "management": 18621, "metrics": 18622}


def page(text: str) -> dict:
    """A /metrics body as its families' types and its samples (host replaced; LatH's values
    kept, Requests2XX's replaced: it counts the scrapes too)."""
    types, samples = tsrun.prometheus_text(text, {"LatH_bucket", "LatH_count", "LatH_sum"}, _label)
    return {"types": types, "samples": sorted(samples, key=repr)}


def _label(name: str, value: str) -> str:
    return "<host>" if name == "Hostname" else value


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-metrics-filter-"))
    store = work / "store"
    store.mkdir()
    model = tsrun.scripted_linear(work)
    tsrun.archive("filter", HERE / "filter_handler.py", store, "--serialized-file", str(model))
    config = {f"{k}_address": f"http://127.0.0.1:{port}" for k, port in PORTS.items()}
    config.update(grpc_inference_port="18623", grpc_management_port="18624")
    config.update(disable_system_metrics="true", install_py_dep_per_model="false")
    config.update(metrics_mode="prometheus", metrics_config=str(HERE / "metrics.yaml"))
    argv = tsrun.command(store, tsrun.properties(work / "config.properties", config))
    ready = lambda: all(tsrun.listening(port) for port in PORTS.values())  # noqa: E731
    pages = {}
    with tsrun.running(argv, work, ready, ports=tuple(PORTS.values())):
        url = f"http://127.0.0.1:{PORTS['management']}/models?url=filter.mar&initial_workers=1"
        assert tsrun.call(url + "&synchronous=true", "POST")[0] == 200
        url = f"http://127.0.0.1:{PORTS['inference']}/predictions/filter"
        assert tsrun.call(url, "POST", b"x")[0] == 200
        for query in QUERIES:
            url = f"http://127.0.0.1:{PORTS['metrics']}/metrics{query}"
            pages[query] = page(tsrun.call(url, "GET")[2].decode())
    tsrun.write_record(HERE, COMMAND, pages=pages)


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
