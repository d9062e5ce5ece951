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
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this recorder's steps, tsrun
import steps  # noqa: E402
import tsrun  # noqa: E402

COMMAND = tsrun.recorder_command(__file__)
PORTS = {"inference": 18300, "management": 18301, "metrics": 18302}


def build(work: Path) -> tuple[Path, Path]:
    models, workflows = work / "model_store", work / "wf_store"
    models.mkdir()
    workflows.mkdir()
    for file_name, name in steps.ARCHIVES.items():
        tsrun.archive(name, HERE / "node_handler.py", models)
        assert (models / file_name).is_file()
    for file_name, spec in steps.WORKFLOWS.items():
        name = file_name.removesuffix(".war")
        command = [tsrun.tool("torch-workflow-archiver"), "--workflow-name", name]
        command += ["--spec-file", str(HERE / spec), "--handler", str(HERE / "workflow_handler.py")]
        subprocess.run([*command, "--export-path", str(workflows)], check=True)
    return models, workflows


def answer(bases: dict[str, str], step: dict) -> dict:
    body = json.dumps(step["json"]).encode() if "json" in step else None
    url = bases[step["listener"]] + step["path"]
    status, ctype, raw = tsrun.call(url, step["method"], body, "application/json")
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = raw.decode("utf-8", "replace")
    print(step["id"], status, flush=True)
    return {"id": step["id"], "status": status, "content_type": ctype, "body": parsed}


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-workflows-"))
    models, workflows = build(work)
    bases = {name: f"http://127.0.0.1:{port}" for name, port in PORTS.items()}
    config = {f"{name}_address": base for name, base in bases.items()}
    config.update(disable_system_metrics="true", install_py_dep_per_model="false")
    config_path = tsrun.properties(work / "config.properties", config)
    argv = tsrun.command(models, config_path, "--workflow-store", str(workflows))
    ready = tsrun.pinged(bases["inference"])
    with tsrun.running(argv, work, ready, timeout_s=180):
        answers = [answer(bases, step) for step in steps.STEPS]
    version_txt = next(Path(sys.prefix).glob("lib/python3*/site-packages/ts/version.txt"))
    record = {
        "command": COMMAND,
        "torchserve": version_txt.read_text().strip(),
        "workflow_archiver": "0.2.15",
        "answers": answers,
    }
    tsrun.write_json(HERE / "answers.json", record)
    if os.environ.get("KEEP_LOG"):
        shutil.copy(work / "ts.out", HERE / "ts.out.txt")
    print(f"wrote {HERE / 'answers.json'}; TorchServe's own output: {work / 'ts.out'}")


if __name__ == "__main__":
    os.environ.setdefault("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    main()
