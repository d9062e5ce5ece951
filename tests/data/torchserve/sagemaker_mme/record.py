"""Record what TorchServe 0.12 answers to SageMaker's multi-model endpoint contract (answers.json).

Run from the repository root with torchbay's virtualenv (it has the toolkit, a dev dependency):

    .venv/bin/python tests/data/torchserve/sagemaker_mme/record.py

The configuration is the one ``sagemaker-pytorch-inference`` 2.0.25 writes with
``SAGEMAKER_MULTI_MODEL=true`` (its ``mme-ts.properties`` + its own lines, flaws and all), with
the edits of ../sagemaker/record.py: ``0.0.0.0`` becomes ``127.0.0.1``, ``metrics_address`` is
added (ports 18400/18402). TorchServe is started with the toolkit's MME command line
(``--model-store /``, no ``--models``) plus ``--foreground --ncs``, twice: once in the toolkit's
environment as it is (its file's run-on line leaves the model API off), once with
``TS_ENABLE_MODEL_API=true`` (the file sets ``enable_envvars_config=true``), which is what a
multi-model container needs. Each run asks SageMaker's calls (``POST /models`` with
``{"model_name", "url"}``, list, describe, invoke, unload) of two model directories in SageMaker's
layout (``<base>/models/<hash>/model``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
SAGEMAKER = HERE.parent / "sagemaker"
sys.path.insert(0, str(SAGEMAKER))
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402
from model_dirs import INPUT, make_model_dir  # noqa: E402
from record import (  # noqa: E402
    BASE,
    PORT,
    foreground,
    pylib,
    recording,
    toolkit_env,
    toolkit_start,
    write_record,
)

os.environ["SAGEMAKER_MULTI_MODEL"] = "true"  # read by the toolkit's modules as they import
JSON = {"Content-Type": "application/json"}


def cases(base: Path) -> list[tuple[str, str, str, dict | list | None]]:
    """(id, method, path, JSON body): SageMaker's calls, in the order they are asked."""
    a, b = str(base / "models" / "hash-a" / "model"), str(base / "models" / "hash-b" / "model")
    return [
        ("ping", "GET", "/ping", None),
        ("list_empty", "GET", "/models", None),
        ("load_a", "POST", "/models", {"model_name": "a", "url": a}),
        ("load_a_again", "POST", "/models", {"model_name": "a", "url": a}),
        ("load_b", "POST", "/models", {"model_name": "b", "url": b}),
        ("load_missing_dir", "POST", "/models", {"model_name": "c", "url": a + "-gone"}),
        ("load_without_url", "POST", "/models", {"model_name": "c"}),
        ("list", "GET", "/models", None),
        ("list_page", "GET", "/models?limit=1", None),
        ("list_next_page", "GET", "/models?limit=1&next_page_token=1", None),
        ("describe_a", "GET", "/models/a", None),
        ("describe_unknown", "GET", "/models/nope", None),
        ("invoke_a", "POST", "/models/a/invoke", INPUT),
        ("invoke_b", "POST", "/models/b/invoke", INPUT),
        ("invoke_unknown", "POST", "/models/nope/invoke", INPUT),
        ("unload_a", "DELETE", "/models/a", None),
        ("unload_a_again", "DELETE", "/models/a", None),
        ("invoke_a_unloaded", "POST", "/models/a/invoke", INPUT),
        ("reload_a", "POST", "/models", {"model_name": "a", "url": a}),
        ("invoke_a_reloaded", "POST", "/models/a/invoke", INPUT),
    ]


def ask(case: tuple[str, str, str, dict | list | None]) -> dict:
    cid, method, path, body = case
    content = json.dumps(body) if body is not None else None
    headers = JSON if body is not None else {}
    r = httpx.request(method, BASE + path, headers=headers, content=content, timeout=240)
    return {
        "id": cid,
        "request": {"method": method, "path": path, "body": body},
        "status": r.status_code,
        "content_type": r.headers.get("content-type"),
        "body": tsrun.json_or_text(r),
    }


def toolkit_config() -> tuple[str, list[str]]:
    """The toolkit's MME config.properties text and its torchserve command line (no models)."""
    os.environ["SAGEMAKER_BIND_TO_PORT"] = str(PORT)
    return toolkit_start()


def run(base: Path, config: Path, command: list[str], extra_env: dict[str, str]) -> dict:
    """Start TorchServe as the toolkit would (in the foreground, with ``extra_env``), ask every
    case, stop it (``tsrun.running``: its output in ``base/ts.out``)."""
    argv = foreground(command, config, [])
    env = {
        **extra_env,
        **toolkit_env(base, base / "ml" / "models" / "code"),
        "SAGEMAKER_HANDLER": "sagemaker_pytorch_serving_container.handler_service",
    }
    ready = lambda: tsrun.listening(PORT)  # noqa: E731
    with tsrun.running(argv, base, ready, env=env, ports=(PORT,), timeout_s=240):
        return {"command": argv, "env": extra_env, "answers": [ask(c) for c in cases(base)]}


def main() -> None:
    with recording("ts-sagemaker-mme") as base:
        make_model_dir(base / "models" / "hash-a" / "model")
        make_model_dir(base / "models" / "hash-b" / "model", scale=10.0)
        pylib(base / "pylib")
        os.environ["SAGEMAKER_BASE_DIR"] = str(base / "ml")
        text, command = toolkit_config()
        config = base / "sagemaker-ts.properties"
        config.write_text(
            text.replace("0.0.0.0", "127.0.0.1") + f"metrics_address=http://127.0.0.1:{PORT + 2}\n"
        )
        as_written = run(base, config, command, {})
        model_api = run(base, config, command, {"TS_ENABLE_MODEL_API": "true"})
        runs = {"as_written": as_written, "model_api_on": model_api}
        toolkit = "sagemaker-pytorch-inference 2.0.25, SAGEMAKER_MULTI_MODEL=true"
        write_record(__file__, base, toolkit, text, runs)


if __name__ == "__main__":
    main()
