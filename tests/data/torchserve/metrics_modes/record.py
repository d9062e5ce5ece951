"""Record what TorchServe 0.12 answers and logs in each metrics case (sequence.CASES) into
answers.json: every step's status and normalised body, and the normalised lines of
``logs/ts_metrics.log`` and ``logs/model_metrics.log``.

Run from the repository root, TorchServe in its own virtualenv (tests/data/torchserve_0.12/
record.py says how it was installed; Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \\
        tests/data/torchserve/metrics_modes/record.py

It builds ``counted.mar`` with torch-model-archiver, then per case starts TorchServe in a fresh
folder on ports 18500-18504 (gRPC on 18503-18504; ``--foreground --ncs --disable-token-auth
--enable-model-api``, no system metrics), makes every call of sequence.STEPS in order, stops it
and reads its logs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sequence  # noqa: E402

COMMAND = (
    "PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python "
    "tests/data/torchserve/metrics_modes/record.py"
)
PORTS = {sequence.INF: 18500, sequence.M: 18501, sequence.X: 18502}


def build_store(work: Path) -> Path:
    import torch

    store = work / "store"
    store.mkdir()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    torch.jit.save(torch.jit.script(model.eval()), str(work / "model.pt"))
    subprocess.run(
        ["torch-model-archiver", "--model-name", "counted", "--version", "1.0",
         "--serialized-file", str(work / "model.pt"),
         "--handler", str(HERE / "metrics_handler.py"), "--export-path", str(store)],
        check=True,
    )  # fmt: skip
    return store


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return False
    return True


def call(base: str, step: dict) -> tuple[int, str, bytes]:
    body = step.get("body")
    request = urllib.request.Request(base + step["path"], data=body, method=step["method"])
    if body is not None:
        request.add_header("Content-Type", "text/plain")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def body_of(step: dict, raw: bytes) -> object:
    text = raw.decode("utf-8", "replace")
    if step["listener"] == sequence.X:
        return sequence.metrics_text(text)
    try:
        return json.loads(text)
    except ValueError:
        return {"text": text}


def run_case(store: Path, name: str, lines: dict[str, str]) -> dict:
    while any(listening(port) for port in PORTS.values()):  # another run's server still there
        time.sleep(0.5)
    work = Path(tempfile.mkdtemp(prefix=f"ts-metrics-{name}-"))
    shutil.copy(HERE / "custom_metrics.yaml", work)
    bases = {k: f"http://127.0.0.1:{port}" for k, port in PORTS.items()}
    config = {f"{k}_address": v for k, v in bases.items()}
    config.update(grpc_inference_port="18503", grpc_management_port="18504")
    config.update(disable_system_metrics="true", install_py_dep_per_model="false", **lines)
    if "metrics_config" in config:
        config["metrics_config"] = str(work / config["metrics_config"])
    (work / "config.properties").write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    (work / "tmp").mkdir()
    out = open(work / "ts.out", "wb")  # noqa: SIM115 (TorchServe writes it while it runs)
    proc = subprocess.Popen(
        ["torchserve", "--start", "--foreground", "--ncs", "--disable-token-auth",
         "--enable-model-api", "--model-store", str(store),
         "--ts-config", str(work / "config.properties")],
        cwd=work, stdout=out, stderr=subprocess.STDOUT,
        env={**os.environ, "TMPDIR": str(work / "tmp"), "LOG_LOCATION": str(work / "logs")},
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:  # wait for the listeners without a call (TorchServe would count it)
            if all(listening(port) for port in PORTS.values()):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"TorchServe did not start; see {work / 'ts.out'}")
            time.sleep(0.5)
        answers = []
        for step in sequence.STEPS:
            status, _, raw = call(bases[step["listener"]], step)
            print(name, step["id"], status, flush=True)
            answers.append({"id": step["id"], "status": status, "body": body_of(step, raw)})
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher and its java server
        proc.wait(60)
        out.close()
        while any(listening(port) for port in PORTS.values()):  # the java server's last moments
            time.sleep(0.5)
    logs = {}
    for log in ("ts_metrics.log", "model_metrics.log"):
        path = work / "logs" / log
        logs[log] = sequence.log_lines(path.read_text()) if path.exists() else None
    return {"config": lines, "answers": answers, "logs": logs, "work": str(work)}


def main() -> None:
    store = build_store(Path(tempfile.mkdtemp(prefix="ts-metrics-store-")))
    cases = {name: run_case(store, name, lines) for name, lines in sequence.CASES.items()}
    for case in cases.values():
        case.pop("work")
    version = subprocess.run(
        [sys.executable, "-m", "pip", "show", "torchserve"], capture_output=True, text=True
    ).stdout
    record = {
        "command": COMMAND,
        "torchserve": next(
            (line.split()[-1] for line in version.splitlines() if line.startswith("Version:")), "?"
        ),
        "cases": cases,
    }
    (HERE / "answers.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {HERE / 'answers.json'}")


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
