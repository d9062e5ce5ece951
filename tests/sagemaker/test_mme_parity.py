"""SageMaker's multi-model endpoint calls against TorchServe 0.12: every case TorchServe answered
in tests/data/torchserve/sagemaker_mme/answers.json (made by record.py there, with the toolkit's
own MME configuration and the same model directories) asked of a real ``torchbay serve`` started
the same way (``--model-store /``, no start-up model), once with the file as the toolkit writes
it (model API off) and once with ``TS_ENABLE_MODEL_API=true``.

Compared: every status; 200 bodies and content types (describe: the fields SageMaker reads and
the settings the toolkit's file gives); error bodies' code and message (``type`` is torchbay's
exception name, as in test_invocations_parity).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.sagemaker.helpers import clean_env, free_port, make_model_dir, mme_config, serve_ready

RECORD = json.loads(
    (Path(__file__).parents[1] / "data/torchserve/sagemaker_mme/answers.json").read_text()
)
# Cases whose error message torchbay words its own way (the code is the same).
OWN_MESSAGE = {
    "load_a": "names the switch that turns the model API on",
    "load_a_again": "the same",
    "load_b": "the same",
    "load_missing_dir": "the same",
    "load_without_url": "the same",
    "unload_a": "the same",
    "unload_a_again": "the same",
    "reload_a": "the same",
}
DESCRIBED = ("modelName", "modelVersion", "modelUrl", "minWorkers", "maxWorkers", "batchSize")


def start(tmp: Path, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """``torchbay serve`` as the toolkit's MME mode starts TorchServe (``--model-store /``, its
    configuration, no ``--models``), in the foreground; returns once it listens."""
    port = free_port()
    config = tmp / "sagemaker-ts.properties"
    config.write_text(mme_config(port).replace("0.0.0.0", "127.0.0.1"))
    # The container's environment as the toolkit leaves it: its handler service reads
    # SAGEMAKER_MULTI_MODEL to put each model's code/ on the worker's path.
    full_env = clean_env(
        tmp,
        PYTHONPATH=str(tmp / "ml" / "models" / "code"),
        SAGEMAKER_MULTI_MODEL="true",
        SAGEMAKER_HANDLER="sagemaker_pytorch_serving_container.handler_service",
        **env,
    )
    return serve_ready(tmp, ["--model-store", "/", "--ts-config", str(config)], full_env), port


def ask(port: int, base: Path, request: dict) -> httpx.Response:
    body = request["body"]
    content = json.dumps(body).replace("<base>", str(base)) if body is not None else None
    headers = {"Content-Type": "application/json"} if body is not None else {}
    url = f"http://127.0.0.1:{port}{request['path']}"
    return httpx.request(request["method"], url, headers=headers, content=content, timeout=240)


def compare(run: str, base: Path, recorded: dict, got: httpx.Response) -> list[str]:
    """What differs between TorchServe's recorded answer and torchbay's."""
    key = (run, recorded["id"])
    if got.status_code != recorded["status"]:
        return [f"{key}: status {got.status_code}, want {recorded['status']}: {got.text[:300]}"]
    want = json.loads(json.dumps(recorded["body"]).replace("<base>", str(base)))
    body = got.json()
    if got.status_code != 200:
        fields = ("code",) if recorded["id"] in OWN_MESSAGE else ("code", "message")
        wrong = [f for f in fields if body.get(f) != want.get(f)]
        return [f"{key}: {f} {body.get(f)!r}, want {want.get(f)!r}" for f in wrong]
    if recorded["id"].startswith("describe"):
        body, want = ([{k: d.get(k) for k in DESCRIBED} for d in b] for b in (body, want))
    ok = body == want and got.headers["content-type"] == recorded["content_type"]
    return [] if ok else [f"{key}: {body!r} ({got.headers['content-type']}), want {want!r}"]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("run", ["as_written", "model_api_on"])
def test_torchbay_answers_sagemaker_mme_calls_as_torchserve(tmp_path: Path, run: str) -> None:
    make_model_dir(tmp_path / "models" / "hash-a" / "model")
    make_model_dir(tmp_path / "models" / "hash-b" / "model", scale=10.0)
    proc, port = start(tmp_path, RECORD["runs"][run]["env"])
    try:
        answers = RECORD["runs"][run]["answers"]
        problems = [
            p for a in answers for p in compare(run, tmp_path, a, ask(port, tmp_path, a["request"]))
        ]
    finally:
        proc.terminate()
        proc.wait(120)
    assert problems == []
    assert len(answers) == 20  # every case of record.py was asked
