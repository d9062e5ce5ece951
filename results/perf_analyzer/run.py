"""Triton's perf_analyzer against torchbay and KServe's Python model server (issue 31, item 4).

    .venv/bin/python results/perf_analyzer/run.py --runs 3 --concurrency 1,4,8 --window-ms 5000

One small TorchScript model (``Linear(64, 256) -> ReLU -> Linear(256, 10)``, FP32, seed 0) is
served two ways, both up for the whole run on the same host and measured in turn:

* torchbay: ``torchbay serve --ncs`` of an archive made by our archiver (the tensor handler,
  inputs ``x`` ``[-1, 64]``), 1 worker, batch size 1, ``cpu_threads_per_worker=1``, no access
  log; OIP over HTTP and gRPC on free ports;
* KServe: ``kserve.ModelServer`` (1 uvicorn worker, its gRPC server) with a minimal
  ``kserve.Model`` that runs the same TorchScript file with ``torch.set_num_threads(1)``. KServe
  has no ``/v2/models/{m}/config`` and no ``ModelConfig`` RPC, which perf_analyzer asks before
  anything else; this script gives KServe that one answer (the same config torchbay reports:
  ``max_batch_size`` 1, input ``x`` ``[64]``, output ``y`` ``[10]``) with one FastAPI route and one
  extra gRPC method handler. Nothing else of KServe is changed.

perf_analyzer (from the ``tritonclient==2.40.0`` manylinux wheel on PyPI, with ``libb64.so.0d``
from Debian's ``libb64-0d`` and ``libcudart.so.12`` from PyPI's ``nvidia-cuda-runtime-cu12``,
unpacked under ``--tools``; nothing is installed on the system) runs once per system, protocol,
concurrency level and run, with the same ``--measurement-interval`` for every system, and writes
its CSV (kept under ``csv/``); the report takes each level's median over the runs. The two
systems' order alternates run by run.

``python kserve_side.py MODEL.pt HTTP_PORT GRPC_PORT`` (beside this file) is the KServe server this
script starts.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

MODEL = "model"
IN, OUT = 64, 10
TOOLS = Path.home() / ".cache" / "torchbay-perf-analyzer"
TRITONCLIENT = "tritonclient==2.40.0"
WHEEL_BINARY = "tritonclient-2.40.0.data/data/bin/perf_analyzer"
# perf_analyzer's CSV columns the report keeps (microseconds, except the throughput)
COLUMNS = {
    "Inferences/Second": "infer_per_s",
    "p50 latency": "p50_us",
    "p90 latency": "p90_us",
    "p95 latency": "p95_us",
    "p99 latency": "p99_us",
    "Client Send": "client_send_us",
    "Client Recv": "client_recv_us",
    # only where the server reports Triton's statistics extension (torchbay does, KServe not)
    "Network+Server Send/Recv": "network_server_us",
    "Server Queue": "server_queue_us",
    "Server Compute Input": "server_compute_input_us",
    "Server Compute Infer": "server_compute_infer_us",
    "Server Compute Output": "server_compute_output_us",
}
CONFIG = {
    "name": MODEL,
    "platform": "pytorch_libtorch",
    "max_batch_size": 1,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [IN]}],
    "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [OUT]}],
}


# ---- perf_analyzer and its libraries ----------------------------------------------------------


def fetch_tools(tools: Path) -> tuple[Path, Path]:
    """perf_analyzer and a folder of the libraries it lacks here, downloaded once into ``tools``
    (PyPI through pip, Debian's mirror through ``apt-get download``; unpacked, not installed)."""
    binary, lib = tools / "bin" / "perf_analyzer", tools / "lib"
    if binary.exists() and (lib / "libb64.so.0d").exists() and (lib / "libcudart.so.12").exists():
        return binary, lib
    dl = tools / "download"
    for d in (dl, binary.parent, lib):
        d.mkdir(parents=True, exist_ok=True)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(dl),
    ]
    subprocess.run([*pip, "--platform", "manylinux1_x86_64", TRITONCLIENT], check=True)
    subprocess.run(
        [*pip, "--platform", "manylinux2014_x86_64", "nvidia-cuda-runtime-cu12"], check=True
    )
    subprocess.run(["apt-get", "download", "libb64-0d"], cwd=dl, check=True)
    _unzip_one(next(dl.glob("tritonclient-2.40.0-*.whl")), WHEEL_BINARY, binary)
    binary.chmod(0o755)
    cuda = next(dl.glob("nvidia_cuda_runtime_cu12-*.whl"))
    _unzip_one(cuda, "nvidia/cuda_runtime/lib/libcudart.so.12", lib / "libcudart.so.12")
    deb = next(dl.glob("libb64-0d_*.deb"))
    subprocess.run(["dpkg", "-x", str(deb), str(dl / "libb64")], check=True)
    shutil.copy(dl / "libb64/usr/lib/x86_64-linux-gnu/libb64.so.0d", lib / "libb64.so.0d")
    return binary, lib


def _unzip_one(wheel: Path, member: str, to: Path) -> None:
    with zipfile.ZipFile(wheel) as z, z.open(member) as src, to.open("wb") as dst:
        shutil.copyfileobj(src, dst)


def perf_command(
    binary: Path, url: str, protocol: str, level: int, args: argparse.Namespace, out: Path
) -> list[str]:
    """One perf_analyzer run at one concurrency level (one run per level, as ``--concurrency-range``
    only steps evenly and the levels are 1, 4, 8), one fixed window length for every system."""
    cmd = [str(binary), "-m", MODEL, "-u", url, "-i", protocol, "-b", "1"]
    cmd += ["--concurrency-range", f"{level}:{level}"]
    cmd += ["--measurement-mode", "time_windows", "--measurement-interval", str(args.window_ms)]
    cmd += ["--max-trials", str(args.max_trials), "--stability-percentage", str(args.stability)]
    return [*cmd, "-f", str(out)]


def parse_csv(text: str) -> list[dict[str, float]]:
    """perf_analyzer's ``-f`` CSV as one dict per concurrency level, the report's columns only
    (``concurrency`` and the names of :data:`COLUMNS`); rows come in perf_analyzer's order, which
    is not the levels' order."""
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        if not row.get("Concurrency"):
            continue
        kept = {"concurrency": int(row["Concurrency"])}
        kept.update({name: float(row[col]) for col, name in COLUMNS.items() if col in row})
        rows.append(kept)
    return rows


def medians(runs: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Per concurrency level, each column's median over the runs (levels every run measured)."""
    by_level: dict[int, list[dict[str, float]]] = {}
    for run in runs:
        for row in run:
            by_level.setdefault(int(row["concurrency"]), []).append(row)
    out = []
    for level, rows in sorted(by_level.items()):
        if len(rows) != len(runs):
            continue
        row = {"concurrency": level, "runs": len(rows)}
        for name in COLUMNS.values():
            if all(name in r for r in rows):
                row[name] = statistics.median(r[name] for r in rows)
        out.append(row)
    return out


# ---- the model and the two servers ------------------------------------------------------------


def build_model(work: Path) -> Path:
    """The TorchScript MLP both servers load, and its torchbay archive in ``work/store``."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(IN, 256), torch.nn.ReLU(), torch.nn.Linear(256, OUT))
    torch.jit.save(torch.jit.script(net.eval()), str(work / "mlp.pt"))
    torch.save(torch.randn(1, IN), work / "example.pt")
    (work / "model-config.yaml").write_text(
        f"inputs:\n  - {{name: x, datatype: FP32, shape: [-1, {IN}]}}\n"
        f"outputs:\n  - {{name: y, datatype: FP32, shape: [-1, {OUT}]}}\n"
    )
    (work / "store").mkdir()
    archive = [sys.executable, "-m", "torchbay", "archive", "--model-name", MODEL, "--version", "1"]
    archive += ["--handler", "tensor", "--export-path", str(work / "store")]
    archive += [
        "--serialized-file",
        str(work / "mlp.pt"),
        "--example-input",
        str(work / "example.pt"),
    ]
    archive += ["--config-file", str(work / "model-config.yaml")]
    subprocess.run(archive, check=True, stdout=subprocess.DEVNULL)
    return work / "mlp.pt"


def torchbay_server(work: Path):
    """``torchbay serve --ncs`` of the archive: 1 worker, batch size 1, 1 torch thread."""
    from torchbay.benchmarks.managed import ManagedServer

    props = "access_log=false\ndefault_workers_per_model=1\ncpu_threads_per_worker=1\n"
    (work / "config.properties").write_text(props)
    args = ("--ts-config", str(work / "config.properties"))
    return ManagedServer.torchbay(
        work / "store" / f"{MODEL}.mar", work / "tb", auth=False, extra_args=args
    )


class KServeServer:
    """``kserve_side.py`` (KServe's server) in a process of its own, on two free ports."""

    def __init__(self, model: Path, work: Path, python: str):
        from torchbay.benchmarks.managed import free_port

        self.http_port, self.grpc_port = free_port(), free_port()
        side = str(Path(__file__).with_name("kserve_side.py"))
        cmd = [python, side, str(model), str(self.http_port), str(self.grpc_port)]
        self.log = (work / "kserve.log").open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=work)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until ``/v2/models/model/ready`` answers 200: KServe writes no ready file."""
        import httpx

        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.http_port}/v2/models/{MODEL}/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"KServe exited with {self.proc.returncode}: see kserve.log")
            try:
                if httpx.get(url, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)  # polls for readiness, bounded by the deadline
        raise SystemExit(f"KServe not ready in {timeout_s:.0f} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# ---- the runs and the report ------------------------------------------------------------------


def measure(binary: Path, lib: Path, urls: dict, args: argparse.Namespace) -> dict:
    """Every run, in each run every protocol, in each protocol both systems (their order
    alternating run by run, so neither always goes first on a host whose load drifts)."""
    env = {**os.environ, "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    levels = [int(c) for c in args.concurrency.split(",")]
    raw: dict[str, list] = {}
    (args.out / "csv").mkdir(parents=True, exist_ok=True)
    for run in range(args.runs):
        for protocol in ("http", "grpc"):
            systems = ["torchbay", "kserve"][:: 1 if run % 2 == 0 else -1]
            for system in systems:
                rows = []
                for level in levels:
                    out = args.out / "csv" / f"{system}-{protocol}-c{level}-run{run}.csv"
                    cmd = perf_command(binary, urls[system, protocol], protocol, level, args, out)
                    print(
                        f"run {run + 1} {system} {protocol} c={level}", file=sys.stderr, flush=True
                    )
                    perf_analyzer(cmd, env)
                    rows += parse_csv(out.read_text())
                raw.setdefault(f"{system} {protocol}", []).append(rows)
    return raw


def perf_analyzer(cmd: list[str], env: dict) -> None:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-2000:]
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{tail}")


def render(result: dict) -> str:
    """The markdown table: per protocol and level, torchbay's and KServe's medians side by side."""
    lines = [
        f"Command: `{result['command']}`  ",
        f"Settings: {result['settings']}  ",
        f"Host: {result['host']}",
        "",
        "| protocol | c | torchbay infer/s | KServe infer/s | torchbay p50 ms | KServe p50 ms "
        "| torchbay p99 ms | KServe p99 ms | torchbay / KServe infer/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol in ("http", "grpc"):
        tb = {r["concurrency"]: r for r in result["medians"][f"torchbay {protocol}"]}
        ks = {r["concurrency"]: r for r in result["medians"][f"kserve {protocol}"]}
        for c in sorted(set(tb) & set(ks)):
            a, b = tb[c], ks[c]
            lines.append(
                f"| {protocol} | {c} | {a['infer_per_s']:.0f} | {b['infer_per_s']:.0f} "
                f"| {a['p50_us'] / 1000:.2f} | {b['p50_us'] / 1000:.2f} "
                f"| {a['p99_us'] / 1000:.2f} | {b['p99_us'] / 1000:.2f} "
                f"| {a['infer_per_s'] / b['infer_per_s']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--concurrency", default="1,4,8", help="concurrency levels")
    p.add_argument(
        "--window-ms", type=int, default=5000, help="perf_analyzer's window, every system"
    )
    p.add_argument("--max-trials", type=int, default=3, help="windows per level (the last 3 count)")
    p.add_argument(
        "--stability",
        type=int,
        default=1000,
        help="perf_analyzer's --stability-percentage: 1000 accepts any 3 windows (a shared host's "
        "windows differ by more than its default 10%%; the medians of the runs stand in for it)",
    )
    p.add_argument("--tools", type=Path, default=TOOLS, help="where perf_analyzer is unpacked")
    p.add_argument("--out", type=Path, default=Path(__file__).parent)
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    binary, lib = fetch_tools(args.tools)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_model(work)
        kserve = KServeServer(model, work, sys.executable)
        try:
            with torchbay_server(work) as tb:
                kserve.wait_ready()
                urls = {
                    ("torchbay", "http"): f"127.0.0.1:{tb.inference_port}",
                    ("torchbay", "grpc"): f"127.0.0.1:{tb.grpc_port}",
                    ("kserve", "http"): f"127.0.0.1:{kserve.http_port}",
                    ("kserve", "grpc"): f"127.0.0.1:{kserve.grpc_port}",
                }
                load_before = os.getloadavg()
                raw = measure(binary, lib, urls, args)
                load_after = os.getloadavg()
        finally:
            kserve.stop()
    write_report(args, raw, load_before, load_after)


def write_report(args: argparse.Namespace, raw: dict, before: tuple, after: tuple) -> None:
    result = {
        "command": "python results/perf_analyzer/run.py " + " ".join(sys.argv[1:]),
        "settings": (
            f"perf_analyzer 2.40.0, -b 1, concurrency {args.concurrency} (one run each), "
            f"time windows of {args.window_ms} ms, --max-trials {args.max_trials}; "
            f"{args.runs} runs, medians; torchbay 1 worker, batch size 1 (no batching delay), "
            f"1 torch thread; KServe {metadata.version('kserve')} 1 uvicorn worker, 1 torch thread"
        ),
        "host": (
            f"{os.cpu_count()} cores shared with other sessions; load average "
            f"{before[0]:.1f} at the start, {after[0]:.1f} at the end; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        ),
        "medians": {name: medians(runs) for name, runs in raw.items()},
        "runs": raw,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "latest.md").write_text("# perf_analyzer: torchbay and KServe\n\n" + render(result))
    print(render(result))


if __name__ == "__main__":
    main(sys.argv[1:])
