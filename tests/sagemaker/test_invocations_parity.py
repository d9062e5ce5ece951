"""SageMaker's serving contract against TorchServe 0.12: every case TorchServe answered in
tests/data/torchserve/sagemaker/answers.json (made by record.py there, with the toolkit's own
configuration and the same model directories) asked of a real ``torchbay serve`` started the
same way, once with the one model the toolkit names and once with a second model beside it.

Compared: every status; 200 bodies (the toolkit's handler's JSON) and content types; error
bodies' code and message (``type`` is torchbay's exception name, as in test_torchserve_parity).
What torchbay does differently on purpose is in DIFFERENCES, each with its reason.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.sagemaker.helpers import (
    DATA,
    clean_env,
    free_port,
    make_model_dir,
    serve_ready,
    toolkit_config,
)

RECORD = json.loads((DATA / "answers.json").read_text())
HEADER = "torchbay also reads a model_name header, as the issue asks (TorchServe: query only)"
SHARED_PORT = (
    "on a shared inference+management port torchbay sends only /models/{m}/invoke to inference; "
    "TorchServe sends every /models/{a}/{b} there, so describing a version breaks"
)
# (run, case) -> (torchbay's status, why): rows of docs/sagemaker.md's differences.
DIFFERENCES: dict[tuple[str, str], tuple[int, str]] = {
    ("one_model", "invocations_header"): (404, HEADER),  # it names "other": not loaded here
    ("two_models", "invocations_header"): (200, HEADER),
    ("one_model", "models_not_invoke"): (405, SHARED_PORT),
    ("two_models", "models_not_invoke"): (405, SHARED_PORT),
}
# Cases the toolkit's handler answers with its own error text (its traceback, with the run's
# paths): the status alone is compared.
HANDLER_TEXT = {"invocations_form_field", "invocations_get"}
# Cases whose error message torchbay words its own way (the code is the same).
OWN_MESSAGE = {"register_with_model_api_line": "names the switch that turns the model API on"}


def start(tmp: Path, extra_models: list[str]) -> tuple[subprocess.Popen, int]:
    """``torchbay serve`` with the toolkit's configuration and command line (TorchServe's flags),
    in the foreground; returns once the start-up models are loaded."""
    port = free_port()
    config = tmp / "sagemaker-ts.properties"
    config.write_text(toolkit_config(port).replace("0.0.0.0", "127.0.0.1"))
    store = tmp / ".sagemaker" / "ts" / "models"
    store.mkdir(parents=True, exist_ok=True)
    args = ["--model-store", str(store), "--ts-config", str(config)]
    args += ["--models", f"model={tmp / 'ml' / 'model'}", *extra_models]
    # The toolkit puts the model's code/ on PYTHONPATH before it starts the server.
    env = clean_env(tmp, PYTHONPATH=str(tmp / "ml" / "model" / "code"))
    return serve_ready(tmp, args, env), port


def ask(port: int, request: dict) -> httpx.Response:
    url = f"http://127.0.0.1:{port}{request['path']}"
    return httpx.request(
        request["method"], url, headers=request["headers"], content=request["body"], timeout=60
    )


def compare(run: str, recorded: dict, got: httpx.Response) -> list[str]:
    """What differs between TorchServe's recorded answer and torchbay's, beyond DIFFERENCES."""
    key = (run, recorded["id"])
    want_status = DIFFERENCES[key][0] if key in DIFFERENCES else recorded["status"]
    if got.status_code != want_status:
        return [f"{key}: status {got.status_code}, want {want_status}: {got.text[:300]}"]
    if key in DIFFERENCES or recorded["id"] in HANDLER_TEXT:
        return []
    body = got.json()
    want = recorded["body"]
    if got.status_code == 200:
        ok = body == want and got.headers["content-type"] == recorded["content_type"]
        return [] if ok else [f"{key}: {body!r} ({got.headers['content-type']}), want {want!r}"]
    fields = ("code",) if recorded["id"] in OWN_MESSAGE else ("code", "message")
    wrong = [f for f in fields if body.get(f) != want.get(f)]
    return [f"{key}: {f} {body.get(f)!r}, want {want.get(f)!r}" for f in wrong]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("run", ["one_model", "two_models"])
def test_torchbay_answers_the_sagemaker_contract_as_torchserve(tmp_path: Path, run: str) -> None:
    make_model_dir(tmp_path / "ml" / "model")
    extra = []
    if run == "two_models":
        extra = [f"other={make_model_dir(tmp_path / 'other', scale=10.0)}"]
    proc, port = start(tmp_path, extra)
    try:
        answers = RECORD["runs"][run]["answers"]
        problems = [p for a in answers for p in compare(run, a, ask(port, a["request"]))]
    finally:
        proc.terminate()
        proc.wait(120)
    assert problems == []
    assert len(answers) == 19  # every case of record.py was asked
