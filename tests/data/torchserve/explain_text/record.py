"""Build text.mar (TorchServe's text_classifier, a tiny EmbeddingBag model) and record what
TorchServe 0.12 answers to its explanations and predictions (answers.json).

Run from the repository root with torchbay's virtualenv:

    .venv/bin/python tests/data/torchserve/explain_text/record.py

TorchServe 0.12 and torch-model-archiver 0.12.0 come from /work/ts-venv (``TS_VENV``
overrides), with Captum 0.9 installed there. The archive holds ``model.py`` (here), its seeded
state dict, TorchServe's ``source_vocab.pt`` (a dict: the words and bigrams of TEXT, as
TorchServe's handler looks up its 2-grams), torchbay's ``vocab.json`` (the same words) and
``model-config.yaml`` (torchbay's ``text: {input: offsets}``: the model takes TorchServe's
flat tokens and offsets). TorchServe runs on ports 18400-18402 with
``--disable-token-auth --ncs --foreground``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

TS_VENV = Path(os.environ.get("TS_VENV", "/work/ts-venv"))
BASE = "http://127.0.0.1:18400"
TEXT = "the movie was great fun"
WORDS = TEXT.split()
BIGRAMS = [" ".join(pair) for pair in itertools.pairwise(WORDS)]
# (id, method, path, headers, body)
CASES = [
    ("explain", "POST", "/explanations/text", {"Content-Type": "text/plain"}, TEXT),
    ("predict", "POST", "/predictions/text", {"Content-Type": "text/plain"}, TEXT),
]


def build(work: Path) -> Path:
    """text.mar in HERE, made by TorchServe's own archiver."""
    sys.path.insert(0, str(HERE))
    from model import TextModel

    torch.manual_seed(0)
    torch.save(TextModel().state_dict(), work / "model.pt")
    vocab = {"<pad>": 0, "<unk>": 1} | {w: i + 2 for i, w in enumerate(WORDS)}
    source_vocab = vocab | {b: len(vocab) + i for i, b in enumerate(BIGRAMS)}
    torch.save(source_vocab, work / "source_vocab.pt")
    (work / "vocab.json").write_text(json.dumps(vocab))
    (work / "index_to_name.json").write_text(json.dumps({"0": "negative", "1": "positive"}))
    (work / "model-config.yaml").write_text("text:\n  input: offsets\n  topk: 2\n")
    extra = ",".join(str(work / f) for f in ("source_vocab.pt", "vocab.json", "index_to_name.json"))
    subprocess.run(
        [
            str(TS_VENV / "bin" / "torch-model-archiver"),
            "--model-name", "text",
            "--version", "1.0",
            "--model-file", str(HERE / "model.py"),
            "--serialized-file", str(work / "model.pt"),
            "--handler", "text_classifier",
            "--extra-files", extra,
            "--config-file", str(work / "model-config.yaml"),
            "--export-path", str(HERE),
            "--force",
        ],
        check=True,
    )  # fmt: skip
    return HERE / "text.mar"


def ask(case: tuple) -> dict:
    cid, method, path, headers, body = case
    r = httpx.request(method, BASE + path, headers=headers, content=body, timeout=120)
    return {
        "id": cid,
        "request": {"method": method, "path": path, "headers": headers, "body": body},
        "status": r.status_code,
        "body": tsrun.json_or_text(r),
    }


ADDRESSES = (
    "inference_address=http://127.0.0.1:18400\n"
    "management_address=http://127.0.0.1:18401\n"
    "metrics_address=http://127.0.0.1:18402\n"
)
# KServe v1 (TorchServe's kserve envelope, service_envelope=kserve): one instance, as
# TorchServe's text_classifier explains only the first row of what it is given.
KSERVE_CASES = [
    (
        "kserve_explain",
        "POST",
        "/v1/models/text:explain",
        {"Content-Type": "application/json"},
        json.dumps({"instances": [{"data": TEXT}]}),
    ),
]


def _listening() -> bool:
    try:
        httpx.get("http://127.0.0.1:18401/models", timeout=2)
    except httpx.HTTPError:
        return False
    return True


def serve_and_ask(base: Path, mar: Path, config: str, cases: list[tuple]) -> tuple[list, list]:
    """Start TorchServe on ``mar`` with ``config`` (config.properties text), ask ``cases``,
    stop it; returns its command line (paths made relative) and the answers."""
    (base / "config.properties").write_text(config)
    argv = [
        str(TS_VENV / "bin" / "torchserve"),
        "--model-store", str(HERE),
        "--models", f"text={mar.name}",
        "--ts-config", str(base / "config.properties"),
        "--disable-token-auth", "--ncs", "--foreground",
    ]  # fmt: skip
    # Its pid file in a folder of this run's own: the previous run's would stop this one.
    env = {**os.environ, "PATH": f"{TS_VENV / 'bin'}:{os.environ['PATH']}"}
    env["TMPDIR"] = tempfile.mkdtemp(dir=base)
    env["LOG_LOCATION"] = env["METRICS_LOCATION"] = str(base / "logs")
    with (base / "console.log").open("a") as log:
        proc = subprocess.Popen(
            argv, cwd=base, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "TorchServe did not start"
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
                models = httpx.get("http://127.0.0.1:18401/models/text", timeout=5).json()
                if any(w["status"] == "READY" for w in models[0]["workers"]):
                    break
            time.sleep(1)
        answers = [ask(c) for c in cases]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        while _listening():  # its JVM outlives the launcher a moment: the next run needs the ports
            time.sleep(0.5)
    here = "tests/data/torchserve/explain_text"
    return [a.replace(str(base), "<base>").replace(str(HERE), here) for a in argv], answers


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="ts-explain-text-"))
    mar = build(base)
    try:
        command, answers = serve_and_ask(base, mar, ADDRESSES, CASES)
        kserve_config = ADDRESSES + "service_envelope=kserve\n"
        _, kserve_answers = serve_and_ask(base, mar, kserve_config, KSERVE_CASES)
    finally:
        print((base / "console.log").read_text()[-3000:])
    record = {
        "made_by": ".venv/bin/python tests/data/torchserve/explain_text/record.py",
        "command": command,
        "torchserve": "0.12.0",
        "answers": answers,
        "kserve_config": "the same with service_envelope=kserve",
        "kserve_answers": kserve_answers,
    }
    (HERE / "answers.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
