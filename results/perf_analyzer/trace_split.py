"""Where torchbay's time goes per request under perf_analyzer at concurrency 1: its own Triton
traces (``plane/trace.py``) of every request of a perf_analyzer run, split into the plane before
the queue, the queue, the worker's round trip (``COMPUTE_START`` -> ``COMPUTE_END``: the request
framed to the worker process, the handler, the answer back in the frontend) and the plane after it.

    .venv/bin/python results/perf_analyzer/trace_split.py --runs 3 \
        > results/perf_analyzer/trace-split.txt

The same model, server settings and perf_analyzer window as ``run.py`` (whose functions it uses),
plus ``trace_file`` and Triton's trace setting ``TIMESTAMPS`` at rate 1 (every request traced,
which itself costs the frontend a little). Printed: per protocol, the median over runs of each
run's median per part, in microseconds, and the handler's own time from the model's statistics.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

spec = importlib.util.spec_from_file_location("pa_run", Path(__file__).with_name("run.py"))
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)

PARTS = {
    "plane before the queue": ("REQUEST_START", "QUEUE_START"),
    "queue": ("QUEUE_START", "COMPUTE_START"),
    "worker round trip": ("COMPUTE_START", "COMPUTE_END"),
    "plane after the worker": ("COMPUTE_END", "REQUEST_END"),
}


def traces(work: Path, expected: int, timeout_s: float = 30.0) -> list[dict]:
    """Every trace in the trace files once ``expected`` are there (the writer is a thread)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = []
        for f in sorted(work.glob("trace.json*")):
            try:  # each file is one JSON array of traces; one being written does not parse yet
                found += json.loads(f.read_text())
            except json.JSONDecodeError:
                continue
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.1)  # polls the writer's files, bounded by the deadline


def one_run(binary: Path, env: dict, base: str, port: int, proto: str, work: Path) -> dict:
    for f in work.glob("trace.json*"):
        f.unlink()
    stats_url = f"{base}/v2/models/{run.MODEL}/stats"
    before = httpx.get(stats_url).json()["model_stats"][0]["inference_stats"]
    setting = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1"}
    httpx.post(
        f"{base}/v2/trace/setting", json={**setting, "log_frequency": "1"}
    ).raise_for_status()
    args = argparse.Namespace(window_ms=5000, max_trials=3, stability=1000)
    cmd = run.perf_command(binary, f"127.0.0.1:{port}", proto, 1, args, work / "pa.csv")
    run.perf_analyzer(cmd, env)
    httpx.post(f"{base}/v2/trace/setting", json={"trace_level": ["OFF"]}).raise_for_status()
    after = httpx.get(stats_url).json()["model_stats"][0]["inference_stats"]
    count = after["success"]["count"] - before["success"]["count"]
    stamps = [{s["name"]: s["ns"] for s in t["timestamps"]} for t in traces(work, count)]
    parts = {
        name: statistics.median(s[b] - s[a] for s in stamps if a in s and b in s) / 1000
        for name, (a, b) in PARTS.items()
    }
    for key in ("compute_input", "compute_infer", "compute_output"):
        ns = after[key]["ns"] - before[key]["ns"]
        parts[f"handler {key} (mean)"] = ns / max(1, count) / 1000
    parts["requests traced / answered"] = f"{len(stamps)} / {count}"
    return parts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    runs = p.parse_args().runs
    binary, lib = run.fetch_tools(run.TOOLS)
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run.build_model(work)
        server = run.torchbay_server(work)
        props = work / "config.properties"
        props.write_text(props.read_text() + f"trace_file={work / 'trace.json'}\n")
        with server as ep:
            base = f"http://127.0.0.1:{ep.inference_port}"
            for proto, port in (("http", ep.inference_port), ("grpc", ep.grpc_port)):
                results = [one_run(binary, env, base, port, proto, work) for _ in range(runs)]
                print(f"{proto}, c=1, {runs} runs, µs (median of the runs' medians):")
                for name in results[0]:
                    values = [r[name] for r in results]
                    if isinstance(values[0], str):
                        print(f"  {name}: {', '.join(values)}")
                    else:
                        print(
                            f"  {name}: {statistics.median(values):.0f}  (runs: "
                            + ", ".join(f"{v:.0f}" for v in values)
                            + ")"
                        )


if __name__ == "__main__":
    main()
