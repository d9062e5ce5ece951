"""Record what TorchServe 0.12 answers to the parity sequence (sequence.py) into answers.json.

Run from the repository root, with TorchServe in its own virtualenv (Java 17 on PATH)::

    python3 -m venv /work/ts-venv
    /work/ts-venv/bin/pip install -c <(echo torch==2.13.0) torch==2.13.0 torchserve==0.12.0 \
        torch-model-archiver==0.12.0
    /work/ts-venv/bin/pip install pyyaml numpy  # TorchServe's backend imports them
    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python tests/data/torchserve_0.12/record.py

It builds the archives with torch-model-archiver in a temporary folder, starts TorchServe there
(``--foreground --ncs --disable-token-auth --enable-model-api``, free ports, Prometheus metrics,
no system metrics), runs every step in order and stops it.
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
    "PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python tests/data/torchserve_0.12/record.py"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_store(work: Path) -> Path:
    import torch

    store = work / "store"
    store.mkdir()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    torch.jit.save(torch.jit.script(model.eval()), str(work / "model.pt"))
    for file_name, (name, version, handler) in sequence.ARCHIVES.items():
        out = work / f"build-{file_name}"
        out.mkdir()
        subprocess.run(
            ["torch-model-archiver", "--model-name", name, "--version", version,
             "--serialized-file", str(work / "model.pt"), "--handler", str(HERE / handler),
             "--export-path", str(out)],
            check=True,
        )  # fmt: skip
        shutil.move(out / f"{name}.mar", store / file_name)
    (store / sequence.NOT_AN_ARCHIVE).write_text("this is not a model archive\n")
    return store


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


def run_step(bases: dict[str, str], step: dict) -> dict:
    deadline = time.monotonic() + 60
    while True:
        status, ctype, raw = call(bases[step["listener"]], step)
        body = sequence.normalise(step, ctype, raw)
        if step.get("until") != "ready" or sequence.ready(body) or time.monotonic() > deadline:
            print(step["id"], status, flush=True)
            return {"id": step["id"], "status": status, "body": body}
        time.sleep(0.5)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-parity-"))
    store = build_store(work)
    ports = {name: free_port() for name in ("inference", "management", "metrics")}
    bases = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    (work / "config.properties").write_text(
        "".join(f"{name}_address={bases[name]}\n" for name in ports)
        + "metrics_mode=prometheus\ndisable_system_metrics=true\n"
        + "install_py_dep_per_model=false\n"
    )
    tmp = work / "tmp"  # TorchServe's pid file lives in the temp dir: one per run
    tmp.mkdir()
    log = open(work / "ts.out", "wb")  # noqa: SIM115 (TorchServe writes it while it runs)
    proc = subprocess.Popen(
        ["torchserve", "--start", "--foreground", "--ncs", "--disable-token-auth",
         "--enable-model-api", "--model-store", str(store),
         "--ts-config", str(work / "config.properties")],
        cwd=work, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                call(bases["inference"], {"method": "GET", "path": "/ping"})
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"TorchServe did not start; see {work / 'ts.out'}") from None
                time.sleep(0.5)
        answers = [run_step(bases, step) for step in sequence.STEPS]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher and its java server
        proc.wait(60)
        log.close()
    version = subprocess.run(
        [sys.executable, "-m", "pip", "show", "torchserve"], capture_output=True, text=True
    ).stdout
    record = {
        "command": COMMAND,
        "torchserve": next(
            (line.split()[-1] for line in version.splitlines() if line.startswith("Version:")), "?"
        ),
        "java": subprocess.run(
            ["java", "-version"], capture_output=True, text=True
        ).stderr.splitlines()[0],
        "answers": answers,
    }
    (HERE / "answers.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {HERE / 'answers.json'}; TorchServe's own output: {work / 'ts.out'}")


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
