"""Record what TorchServe 0.12 answers to its health, metrics and description calls with token
authorization on (its default since 0.11.1), without a token, with a wrong one and with the
inference or management key (answers.json). No model is registered.

Run from the repository root, TorchServe in its own virtualenv (Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \
        tests/data/torchserve/health_tokens/record.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

CALLS = (  # (listener, method, path)
    ("inference", "GET", "/ping"),
    ("inference", "GET", "/v2/health/live"),
    ("inference", "GET", "/v2/health/ready"),
    ("inference", "OPTIONS", "/"),
    ("management", "GET", "/models"),
    ("management", "OPTIONS", "/"),
    ("metrics", "GET", "/metrics"),
)


def ask(url: str, method: str, key: str | None) -> list:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    status, _, body = tsrun.call(url, method, headers=headers)
    if status < 400 and len(body) > 200:
        return [status, f"{len(body)} bytes"]  # a description or a metrics page
    try:
        return [status, json.loads(body)]
    except ValueError:
        return [status, body.decode("utf-8", "replace")]


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="health-tokens-"))
    (work / "store").mkdir()
    bases = {name: f"http://127.0.0.1:{tsrun.free_port()}" for name in tsrun.LISTENERS}
    config = tsrun.properties(
        work / "config.properties", {f"{n}_address": b for n, b in bases.items()}
    )
    argv = tsrun.command(work / "store", config)
    argv.remove("--disable-token-auth")
    answers = []
    with tsrun.running(argv, work, tsrun.pinged(bases["inference"])):
        keys = json.loads((work / "key_file.json").read_text())
        tokens = {"none": None, "wrong": "not-a-key"}
        tokens |= {kind: keys[kind]["key"] for kind in ("inference", "management")}
        for listener, method, path in CALLS:
            url = bases[listener] + path
            asked = {label: ask(url, method, key) for label, key in tokens.items()}
            answers.append({"call": f"{method} {listener} {path}", **asked})
    tsrun.write_answers(HERE, tsrun.recorder_command(__file__), answers, work)


if __name__ == "__main__":
    main()
