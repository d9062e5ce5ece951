"""Record what TorchServe 0.12 answers to SageMaker's serving contract (answers.json).

Run from the repository root with torchbay's virtualenv (it has the toolkit, a dev dependency):

    .venv/bin/python tests/data/torchserve/sagemaker/record.py

TorchServe 0.12 comes from /work/ts-venv (``TS_VENV`` overrides). The configuration is the one
``sagemaker-pytorch-inference`` 2.0.25 writes (``torchserve._generate_ts_config_properties``,
flaws and all), with two edits so the run stays on this host's reference ports: ``0.0.0.0``
becomes ``127.0.0.1`` and ``metrics_address`` is added. TorchServe is started with the toolkit's
command line (``--model-store``, ``--ts-config``, ``--log-config``, ``--models model=<dir>``)
plus ``--foreground --ncs``, once with the one model the toolkit names and once with a second
model directory beside it. TorchServe's workers import the toolkit from a folder of links
(the toolkit, six, retrying, scipy), as the toolkit's container has them installed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402
from model_dirs import INPUT, make_model_dir  # noqa: E402

TS_VENV = Path(os.environ.get("TS_VENV", "/work/ts-venv"))
PORT, METRICS_PORT = 18400, 18402
BASE = f"http://127.0.0.1:{PORT}"
JSON = {"Content-Type": "application/json"}
BODY = json.dumps(INPUT)

# (id, method, path, headers): asked of the one-model server, then of the two-model one.
CASES = [
    ("ping", "GET", "/ping", {}),
    ("invocations", "POST", "/invocations", JSON),
    ("invocations_query", "POST", "/invocations?model_name=model", JSON),
    ("invocations_query_other", "POST", "/invocations?model_name=other", JSON),
    ("invocations_header", "POST", "/invocations", {**JSON, "model_name": "other"}),
    ("invocations_unknown", "POST", "/invocations?model_name=nope", JSON),
    ("invocations_get", "GET", "/invocations", JSON),
    ("invoke", "POST", "/models/model/invoke", JSON),
    ("invoke_other", "POST", "/models/other/invoke", JSON),
    ("invoke_unknown", "POST", "/models/nope/invoke", JSON),
    ("models_not_invoke", "POST", "/models/model/predict", JSON),
    ("predictions", "POST", "/predictions/model", JSON),
    ("register_with_model_api_line", "POST", "/models?url=x.mar", {}),
]


def pylib(dest: Path) -> Path:
    """Links to what the toolkit's handler service imports beyond TorchServe's virtualenv."""
    import retrying
    import sagemaker_inference
    import sagemaker_pytorch_serving_container
    import scipy
    import six

    dest.mkdir()
    for module in (sagemaker_inference, sagemaker_pytorch_serving_container, scipy):
        src = Path(module.__file__).parent
        (dest / src.name).symlink_to(src)
    libs = Path(scipy.__file__).parent.with_name("scipy.libs")
    if libs.is_dir():
        (dest / libs.name).symlink_to(libs)
    for module in (six, retrying):
        (dest / Path(module.__file__).name).symlink_to(module.__file__)
    return dest


def toolkit_config(base: Path) -> tuple[str, list[str]]:
    """The toolkit's config.properties text and its torchserve command line, for ``base``."""
    os.environ["SAGEMAKER_BASE_DIR"] = str(base / "ml")
    os.environ["SAGEMAKER_BIND_TO_PORT"] = str(PORT)
    os.chdir(base)
    from sagemaker_pytorch_serving_container import torchserve

    text, command = toolkit_start()
    return text, [
        *command,
        "--models",
        f"{torchserve.DEFAULT_TS_MODEL_NAME}={base / 'ml' / 'model'}",
    ]


def toolkit_start() -> tuple[str, list[str]]:
    """The toolkit's config.properties text and the torchserve command line it starts with
    (before the models it names), as its ``torchserve.start_torchserve`` writes them."""
    from sagemaker_pytorch_serving_container import handler_service, torchserve

    text = torchserve._generate_ts_config_properties(handler_service.__file__)
    command = ["torchserve", "--start", "--model-store", torchserve.MODEL_STORE]
    command += ["--ts-config", torchserve.TS_CONFIG_FILE]
    return text, [*command, "--log-config", torchserve.DEFAULT_TS_LOG_FILE]


def ready(models: list[str]) -> bool:
    """Every model has a READY worker (TorchServe's describe, asked on the inference port)."""
    try:
        return all(
            any(
                w["status"] == "READY"
                for w in httpx.get(f"{BASE}/models/{m}", timeout=5).json()[0]["workers"]
            )
            for m in models
        )
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return False


def ask(case: tuple[str, str, str, dict[str, str]]) -> dict:
    cid, method, path, headers = case
    body = BODY if method == "POST" and headers else None
    r = httpx.request(method, BASE + path, headers=headers, content=body, timeout=60)
    try:
        parsed = r.json()
    except ValueError:
        parsed = None
    return {
        "id": cid,
        "request": {"method": method, "path": path, "headers": headers, "body": body},
        "status": r.status_code,
        "content_type": r.headers.get("content-type"),
        "body": parsed if parsed is not None else r.text,
    }


def run(base: Path, config: Path, command: list[str], extra_models: list[str]) -> dict:
    """Start TorchServe as the toolkit would (in the foreground), ask every case, stop it."""
    argv = [a for a in command if a != "--start"] + extra_models + ["--foreground", "--ncs"]
    argv[argv.index("--ts-config") + 1] = str(config)
    env = {
        "PATH": f"{TS_VENV / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": f"{base / 'ml' / 'model' / 'code'}:{base / 'pylib'}",
        "LOG_LOCATION": str(base / "logs"),
        # Its pid file: other TorchServes on this host (and the previous run) keep theirs.
        "TMPDIR": tempfile.mkdtemp(dir=base),
        "METRICS_LOCATION": str(base / "logs"),
    }
    names = ["model"] + [m.split("=")[0] for m in extra_models]
    with tsrun.running(argv, base, lambda: ready(names), env=env, ports=(PORT,), timeout_s=240):
        return {"command": argv, "answers": [ask(c) for c in CASES]}


def main() -> None:
    root = Path.cwd()
    base = Path(tempfile.mkdtemp(prefix="ts-sagemaker-"))
    try:
        make_model_dir(base / "ml" / "model")
        make_model_dir(base / "other", scale=10.0)
        pylib(base / "pylib")
        text, command = toolkit_config(base)
        Path(command[command.index("--model-store") + 1]).mkdir(parents=True, exist_ok=True)
        config = base / "sagemaker-ts.properties"
        config.write_text(
            text.replace("0.0.0.0", "127.0.0.1")
            + f"metrics_address=http://127.0.0.1:{METRICS_PORT}\n"
        )
        one = run(base, config, command, [])
        console_one = (base / "ts.out").read_text()
        two = run(base, config, command, [f"other={base / 'other'}"])
        record = {
            "made_by": ".venv/bin/python tests/data/torchserve/sagemaker/record.py",
            "torchserve": "0.12.0",
            "toolkit": "sagemaker-pytorch-inference 2.0.25",
            "toolkit_config": text,
            "runs": {"one_model": one, "two_models": two},
            "startup_config_lines": [
                line
                for line in console_one.splitlines()
                if "model api" in line.lower() or "timeout" in line.lower()
            ],
        }
        out = json.dumps(record, indent=1).replace(str(base), "<base>")
        (root / "tests/data/torchserve/sagemaker/answers.json").write_text(out + "\n")
    finally:
        if (base / "ts.out").exists():
            shutil.copy(base / "ts.out", tempfile.gettempdir() + "/ts-sagemaker-console.log")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
