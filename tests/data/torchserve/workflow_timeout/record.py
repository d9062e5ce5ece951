"""Record what TorchServe 0.12 does with a workflow whose ``timeout-ms`` is 0 or below
(answers.json): zero.yaml (0) and negative.yaml (-1), each ``pre_processing`` (a function node)
then ``double`` (a model node), with the workflows recorder's handlers
(../workflows/node_handler.py, workflow_handler.py), registered and asked once. Run from the
repository root (one command):

    PATH=/work/ts-venv/bin:$PATH \\
        /work/ts-venv/bin/python tests/data/torchserve/workflow_timeout/record.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKFLOWS = HERE.parent / "workflows"
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

SPECS = ("zero", "negative")


def build(work: Path) -> tuple[Path, Path]:
    models, workflows = work / "model_store", work / "wf_store"
    models.mkdir()
    workflows.mkdir()
    tsrun.archive("double", WORKFLOWS / "node_handler.py", models)
    for name in SPECS:
        command = [tsrun.tool("torch-workflow-archiver"), "--workflow-name", name]
        command += ["--spec-file", str(HERE / f"{name}.yaml")]
        command += ["--handler", str(WORKFLOWS / "workflow_handler.py")]
        subprocess.run([*command, "--export-path", str(workflows)], check=True)
    return models, workflows


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-wf-timeout-"))
    models, workflows = build(work)
    bases = {name: f"http://127.0.0.1:{tsrun.free_port()}" for name in tsrun.LISTENERS}
    config = {f"{name}_address": base for name, base in bases.items()}
    config.update(disable_system_metrics="true", install_py_dep_per_model="false")
    argv = tsrun.command(models, tsrun.properties(work / "config.properties", config))
    argv += ["--workflow-store", str(workflows)]
    answers = []
    with tsrun.running(argv, work, tsrun.pinged(bases["inference"]), timeout_s=180):
        for name in SPECS:
            url = f"{bases['management']}/workflows?url={name}.war"
            register = tsrun.json_call("POST", url, None)
            body = json.dumps({"values": [1, 2]}).encode()
            predict = tsrun.json_call("POST", f"{bases['inference']}/wfpredict/{name}", body)
            answers.append({"id": name, "register": register, "predict": predict})
    tsrun.write_answers(HERE, tsrun.recorder_command(__file__), answers, work)


if __name__ == "__main__":
    main()
