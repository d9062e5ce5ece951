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

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
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
BODY = json.dumps(INPUT)

# {id, method, path, headers[, body]} (cases.json): asked of the one-model server, then of the
# two-model one; a POST with headers and no body of its own sends BODY.
CASES = json.loads((HERE / "cases.json").read_text())


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


def ask(case: dict) -> dict:
    cid, method, path, headers = case["id"], case["method"], case["path"], case["headers"]
    body = case.get("body", BODY if method == "POST" and headers else None)
    r = httpx.request(method, BASE + path, headers=headers, content=body, timeout=60)
    return {
        "id": cid,
        "request": {"method": method, "path": path, "headers": headers, "body": body},
        "status": r.status_code,
        "content_type": r.headers.get("content-type"),
        "body": tsrun.json_or_text(r),
    }


def run(base: Path, config: Path, command: list[str], extra_models: list[str]) -> dict:
    """Start TorchServe as the toolkit would (in the foreground), ask every case, stop it."""
    argv = foreground(command, config, extra_models)
    env = toolkit_env(base, base / "ml" / "model" / "code")
    names = ["model"] + [m.split("=")[0] for m in extra_models]
    with tsrun.running(argv, base, lambda: ready(names), env=env, ports=(PORT,), timeout_s=240):
        return {"command": argv, "answers": [ask(c) for c in CASES]}


def foreground(command: list[str], config: Path, extra: list[str]) -> list[str]:
    """The toolkit's torchserve ``command`` run in the foreground (``extra`` after its own
    arguments), its configuration file ``config``."""
    argv = [a for a in command if a != "--start"] + extra + ["--foreground", "--ncs"]
    argv[argv.index("--ts-config") + 1] = str(config)
    return argv


def toolkit_env(base: Path, code: Path) -> dict[str, str]:
    """TorchServe's environment as the toolkit's container has it: TorchServe 0.12 first on
    PATH, the model's ``code`` and the toolkit's links (``base/pylib``) on PYTHONPATH, its logs
    in ``base/logs``; and a pid folder of its own (other TorchServes on this host, and the
    previous run, keep theirs)."""
    return {
        "PATH": f"{TS_VENV / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": f"{code}:{base / 'pylib'}",
        "LOG_LOCATION": str(base / "logs"),
        "METRICS_LOCATION": str(base / "logs"),
        "TMPDIR": tempfile.mkdtemp(dir=base),
    }


@contextlib.contextmanager
def recording(name: str) -> Iterator[Path]:
    """A fresh base folder for the run; on leaving, TorchServe's console output is kept as
    ``$TMPDIR/<name>.log`` and the folder removed."""
    base = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    try:
        yield base
    finally:
        if (base / "ts.out").exists():
            shutil.copy(base / "ts.out", Path(tempfile.gettempdir(), f"{name}.log"))
        shutil.rmtree(base, ignore_errors=True)


def write_record(script: str, base: Path, toolkit: str, config: str, runs: dict, **more) -> None:
    """The answers.json beside the recorder ``script``: the command that made it, TorchServe's
    and the toolkit's versions, the toolkit's configuration text and the ``runs`` (``more``
    after them); the run's folder is written ``<base>``."""
    here = Path(script).resolve().parent
    record = {
        "made_by": f".venv/bin/python {(here / 'record.py').relative_to(HERE.parents[3])}",
        "torchserve": "0.12.0",
        "toolkit": toolkit,
        "toolkit_config": config,
        "runs": runs,
        **more,
    }
    out = json.dumps(record, indent=1).replace(str(base), "<base>")
    (here / "answers.json").write_text(out + "\n")


def main() -> None:
    with recording("ts-sagemaker") as base:
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
        runs = {"one_model": one, "two_models": two}
        lines = console_one.splitlines()
        startup = [x for x in lines if "model api" in x.lower() or "timeout" in x.lower()]
        toolkit = "sagemaker-pytorch-inference 2.0.25"
        write_record(__file__, base, toolkit, text, runs, startup_config_lines=startup)


if __name__ == "__main__":
    main()
