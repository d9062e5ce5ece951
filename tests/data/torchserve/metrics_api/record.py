"""Record what TorchServe 0.12 answers, publishes and logs when a handler uses its
``context.metrics`` API as api_handler.py does (one request per case of ``CASES``), into
answers.json: each request's status and JSON answer, the /metrics samples of the handler's
families (prometheus mode) and the handler's lines of ``logs/model_metrics.log`` (log mode).

Run from the repository root, TorchServe in its own virtualenv (tests/data/torchserve_0.12/
record.py says how it was installed; Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \\
        tests/data/torchserve/metrics_api/record.py

Each mode runs TorchServe in a fresh folder on ports 18610-18614 (``--foreground --ncs
--disable-token-auth --enable-model-api``, no system metrics, ``model_metrics_auto_detect``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]
import tsrun  # noqa: E402

COMMAND = tsrun.recorder_command(__file__)
CASES = (
    "wrong_dimension_count",
    "string_gauge",
    "numeric_string_gauge",
    "negative_counter",
    "error",
    "get_missing",
    "dimension_renamed",
    "unit_changed",
    "nan_gauge",
    "infinite_gauge",
    "nan_histogram",
    "gauge_then_nan",
)
# The handler's families (what auto-detect may publish for them; NanHist_count: its histogram's
# count sample).
FAMILIES = (
    "WrongDims",
    "StrGauge",
    "NumStrGauge",
    "NegCounter",
    "ErrMetric",
    "NoSuchMetric",
    "Renamed",
    "UnitKept",
    "NanGauge",
    "InfGauge",
    "NegInfGauge",
    "NanHist",
    "NanHist_count",
    "InfCounter",
    "ThenNan",
)
PORTS = {"inference": 18610, "management": 18611, "metrics": 18612}
_LINE = re.compile(r"^(?P<name>\w+)\.(?P<rest>[^|]*\|#[^|]*)\|#hostname:")


def samples(text: str) -> list[list]:
    """The handler families' samples of a /metrics body: [name, [[label, value], ...], value],
    the host label's value replaced, sorted."""
    _, found = tsrun.prometheus_text(text, FAMILIES, _label)
    return sorted((s for s in found if s[0] in FAMILIES), key=repr)


def log_lines(text: str) -> list[str]:
    """The handler families' model_metrics.log lines as ``Name.Unit:value|#dims``, sorted."""
    lines = (line.split(" - ", 1)[-1] for line in text.splitlines())
    found = (_LINE.match(line) for line in lines)
    return sorted(f"{m['name']}.{m['rest']}" for m in found if m and m["name"] in FAMILIES)


def _label(name: str, value: str) -> str:
    return "<host>" if name == "Hostname" else value


def run(store: Path, mode: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"ts-metrics-api-{mode}-"))
    config = {f"{k}_address": f"http://127.0.0.1:{port}" for k, port in PORTS.items()}
    config.update(grpc_inference_port="18613", grpc_management_port="18614")
    config.update(disable_system_metrics="true", install_py_dep_per_model="false")
    config.update(metrics_mode=mode, model_metrics_auto_detect="true")
    argv = tsrun.command(store, tsrun.properties(work / "config.properties", config))
    ready = lambda: all(tsrun.listening(port) for port in PORTS.values())  # noqa: E731
    env = {"LOG_LOCATION": str(work / "logs")}
    answers = {}
    with tsrun.running(argv, work, ready, env=env, ports=tuple(PORTS.values())):
        url = f"http://127.0.0.1:{PORTS['management']}/models?url=api.mar&initial_workers=1"
        assert tsrun.call(url + "&synchronous=true", "POST")[0] == 200
        for case in CASES:
            url = f"http://127.0.0.1:{PORTS['inference']}/predictions/api"
            status, _, raw = tsrun.call(url, "POST", case.encode())
            answers[case] = {"status": status, "body": json.loads(raw)}
        scrape = tsrun.call(f"http://127.0.0.1:{PORTS['metrics']}/metrics", "GET")[2].decode()
    model_log = work / "logs" / "model_metrics.log"
    out = {"answers": answers, "samples": samples(scrape)}
    out["log"] = log_lines(model_log.read_text()) if model_log.exists() else []
    return out


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-metrics-api-store-"))
    store = work / "store"
    store.mkdir()
    model = tsrun.scripted_linear(work)
    tsrun.archive("api", HERE / "api_handler.py", store, "--serialized-file", str(model))
    modes = {mode: run(store, mode) for mode in ("prometheus", "log")}
    tsrun.write_record(HERE, COMMAND, modes=modes)


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
