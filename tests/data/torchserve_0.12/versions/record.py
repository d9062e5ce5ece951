"""Record what TorchServe 0.12 answers to the steps of versions.py into answers.json.

Run from the repository root with torchbay's virtualenv (for grpcio and httpx), TorchServe's
commands taken from its own virtualenv (``TS_VENV``, /work/ts-venv; Java 17 on PATH)::

    .venv/bin/python tests/data/torchserve_0.12/versions/record.py

It builds the archives of ``versions.ARCHIVES`` with TorchServe's torch-model-archiver from
their handler files over a tiny TorchScript model, starts TorchServe in a folder of its own
(``--foreground --ncs --disable-token-auth --enable-model-api``, free ports, gRPC too, no system
metrics), generates gRPC stubs from the .proto files torchbay ships (TorchServe's own), runs
every step in order and stops it.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import grpc
import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "torchserve"), str(ROOT)]
import tsrun  # noqa: E402
import versions  # noqa: E402

TS_BIN = Path(os.environ.get("TS_VENV", "/work/ts-venv")) / "bin"
COMMAND = ".venv/bin/python tests/data/torchserve_0.12/versions/record.py"


def stubs(out: Path) -> SimpleNamespace:
    """TorchServe's inference and management stubs, generated into ``out``."""
    import grpc_tools
    from grpc_tools import protoc

    from torchbay.server.grpc import messages

    out.mkdir()
    include = Path(grpc_tools.__file__).parent / "_proto"
    for proto in ("inference.proto", "management.proto", "google/rpc/status.proto"):
        args = ["protoc", f"-I{messages.PROTOS}", f"-I{include}", f"--python_out={out}"]
        assert protoc.main([*args, f"--grpc_python_out={out}", proto]) == 0, proto
    sys.path.insert(0, str(out))
    names = ("inference_pb2", "inference_pb2_grpc", "management_pb2", "management_pb2_grpc")
    return SimpleNamespace(**{n: importlib.import_module(n) for n in names})


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-versions-"))
    archiver = str(TS_BIN / "torch-model-archiver")
    store = tsrun.build_store(work, versions.ARCHIVES, HERE, archiver)
    ports = {name: tsrun.free_port() for name in (*tsrun.LISTENERS, "gi", "gm")}
    bases = {name: f"http://127.0.0.1:{ports[name]}" for name in tsrun.LISTENERS}
    config = {f"{name}_address": base for name, base in bases.items()}
    config.update(grpc_inference_port=ports["gi"], grpc_management_port=ports["gm"])
    config.update(disable_system_metrics="true", install_py_dep_per_model="false")
    argv = [str(TS_BIN / "torchserve"), *tsrun.START_FLAGS[1:], "--model-store", str(store)]
    argv += ["--ts-config", str(tsrun.properties(work / "config.properties", config))]
    env = {"PATH": f"{TS_BIN}:{os.environ['PATH']}", "TS_DISABLE_TOKEN_AUTHORIZATION": "true"}
    generated = stubs(work / "stubs")
    channels = {
        "inference": grpc.insecure_channel(f"127.0.0.1:{ports['gi']}"),
        "management": grpc.insecure_channel(f"127.0.0.1:{ports['gm']}"),
    }
    answers = []
    ready = tsrun.pinged(bases["inference"])
    with tsrun.running(argv, work, ready, env=env), httpx.Client(timeout=120) as client:
        for step in versions.STEPS:
            answer = versions.call(step, client, bases, channels, generated)
            print(step["id"], answer["status"], flush=True)
            answers.append({"id": step["id"], **answer})
    tsrun.write_answers(HERE, COMMAND, answers, work, python=str(TS_BIN / "python"))


if __name__ == "__main__":
    main()
