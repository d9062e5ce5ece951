"""Record what TorchServe 0.12 answers to the workflow steps (steps.py) into answers.json.

Run from the repository root (TorchServe 0.12, torch-model-archiver 0.12.0 and
torch-workflow-archiver 0.2.15 in /work/ts-venv, Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python tests/data/torchserve/workflows/record.py

It builds the two model archives (node_handler.py, no serialized file: the models are made in
code) and the four workflow archives (workflow_handler.py) with TorchServe's own archivers,
starts TorchServe on 127.0.0.1:18300-18302 (``--foreground --ncs --disable-token-auth
--enable-model-api``, a model store and a workflow store), runs every step in order and stops it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import steps  # noqa: E402

COMMAND = (
    "PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python "
    "tests/data/torchserve/workflows/record.py"
)
PORTS = {"inference": 18300, "management": 18301, "metrics": 18302}


def build(work: Path) -> tuple[Path, Path]:
    models, workflows = work / "model_store", work / "wf_store"
    models.mkdir()
    workflows.mkdir()
    for file_name, name in steps.ARCHIVES.items():
        subprocess.run(
            ["torch-model-archiver", "--model-name", name, "--version", "1.0",
             "--handler", str(HERE / "node_handler.py"), "--export-path", str(models)],
            check=True,
        )  # fmt: skip
        assert (models / file_name).is_file()
    for file_name, spec in steps.WORKFLOWS.items():
        name = file_name.removesuffix(".war")
        subprocess.run(
            ["torch-workflow-archiver", "--workflow-name", name, "--spec-file", str(HERE / spec),
             "--handler", str(HERE / "workflow_handler.py"), "--export-path", str(workflows)],
            check=True,
        )  # fmt: skip
    return models, workflows


def call(base: str, step: dict) -> tuple[int, str, bytes]:
    body = json.dumps(step["json"]).encode() if "json" in step else None
    request = urllib.request.Request(base + step["path"], data=body, method=step["method"])
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def answer(bases: dict[str, str], step: dict) -> dict:
    status, ctype, raw = call(bases[step["listener"]], step)
    try:
        body = json.loads(raw)
    except ValueError:
        body = raw.decode("utf-8", "replace")
    print(step["id"], status, flush=True)
    return {"id": step["id"], "status": status, "content_type": ctype, "body": body}


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-workflows-"))
    models, workflows = build(work)
    bases = {name: f"http://127.0.0.1:{port}" for name, port in PORTS.items()}
    (work / "config.properties").write_text(
        "".join(f"{name}_address={bases[name]}\n" for name in PORTS)
        + "disable_system_metrics=true\ninstall_py_dep_per_model=false\n"
    )
    tmp = work / "tmp"
    tmp.mkdir()
    log = open(work / "ts.out", "wb")  # noqa: SIM115 (TorchServe writes it while it runs)
    proc = subprocess.Popen(
        ["torchserve", "--start", "--foreground", "--ncs", "--disable-token-auth",
         "--enable-model-api", "--model-store", str(models), "--workflow-store", str(workflows),
         "--ts-config", str(work / "config.properties")],
        cwd=work, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                call(bases["inference"], {"method": "GET", "path": "/ping"})
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"TorchServe did not start; see {work / 'ts.out'}") from None
                time.sleep(0.5)
        answers = [answer(bases, step) for step in steps.STEPS]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        log.close()
    record = {
        "command": COMMAND,
        "torchserve": (Path(sys.prefix).glob("lib/python3*/site-packages/ts/version.txt")
                       .__next__().read_text().strip()),
        "workflow_archiver": "0.2.15",
        "answers": answers,
    }  # fmt: skip
    (HERE / "answers.json").write_text(json.dumps(record, indent=1) + "\n")
    shutil.copy(work / "ts.out", HERE / "ts.out.txt") if os.environ.get("KEEP_LOG") else None
    print(f"wrote {HERE / 'answers.json'}; TorchServe's own output: {work / 'ts.out'}")


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
