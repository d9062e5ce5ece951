"""Model versions and the management API's finer points over REST and gRPC, shared by
``record.py`` (run against TorchServe 0.12) and tests/server/test_torchserve_versions.py (run
against torchbay): the steps (steps.json), how one is called, and the one normalisation both
apply to an answer before it is recorded or compared.

A step is HTTP, ``{id, method, listener, path}`` (``body``: text sent as text/plain), or gRPC,
``{id, rpc, args}`` (``service``: ``inference`` for TorchServe's InferenceAPIsService, else its
ManagementAPIsService; a Predictions ``input`` is text sent as bytes). ``until: "ready"``
repeats the call until every worker of the described versions is READY (bounded). An answer is
``{"status": HTTP status or gRPC code name, "body": ...}``: a gRPC error's body is its details,
an answer's is its ``msg`` (management) or its prediction's text (inference), JSON decoded when
it is JSON. A Java exception's class name that TorchServe appends to a gRPC error's details
(``"...\\norg.pytorch.serve...Exception"``) is kept in the record (``java_class``) and left out
of the details compared: torchbay's details are the message alone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import grpc
import httpx

# The model store of both runs (archive file: model name, version, handler file): the parity
# handler (a module-level ``handle``), and a BaseHandler with its own ``describe_handle``.
_PARITY, _DESCRIBED = "../parity_handler.py", "described_handler.py"
ARCHIVES = {
    "tiny.mar": ("tiny", "1.0", _PARITY),
    "tiny-v2.mar": ("tiny", "2.0", _PARITY),
    "odd.mar": ("odd.name-x_1", "1.0-rc_1", _PARITY),
    "desc.mar": ("desc", "1.0", _DESCRIBED),
}
STEPS: list[dict[str, Any]] = json.loads(Path(__file__).with_name("steps.json").read_text())
_VOLATILE_WORKER = ("id", "startTime", "memoryUsage", "pid", "gpuUsage")


def ready(body: Any) -> bool:
    """``until: ready``: every worker of every described version is READY (and there is one)."""
    if not isinstance(body, list) or not body:
        return False
    workers = [w for entry in body if isinstance(entry, dict) for w in entry.get("workers", [])]
    return bool(workers) and all(w.get("status") == "READY" for w in workers)


def decoded(text: str) -> Any:
    """``text`` as JSON (describe entries' volatile worker values replaced), or as it is."""
    try:
        body = json.loads(text)
    except ValueError:
        return text
    for entry in body if isinstance(body, list) else []:
        for worker in entry.get("workers", []) if isinstance(entry, dict) else []:
            for key in _VOLATILE_WORKER:
                if key in worker:
                    worker[key] = f"<{key}>"
    return body


def _grpc_call(step: dict[str, Any], channels: dict[str, grpc.Channel], stubs: Any) -> dict:
    if step.get("service") == "inference":
        stub = stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channels["inference"])
        args = dict(step["args"])
        args["input"] = {k: v.encode() for k, v in args.get("input", {}).items()}
        request = stubs.inference_pb2.PredictionsRequest(**args)
    else:
        stub = stubs.management_pb2_grpc.ManagementAPIsServiceStub(channels["management"])
        request = getattr(stubs.management_pb2, step["rpc"] + "Request")(**step["args"])
    try:
        reply = getattr(stub, step["rpc"])(request, timeout=120)
    except grpc.RpcError as exc:
        details, _, java_class = (exc.details() or "").partition("\n")
        answer = {"status": exc.code().name, "body": details}
        return answer | ({"java_class": java_class} if java_class else {})
    text = reply.prediction.decode() if step.get("service") == "inference" else reply.msg
    return {"status": "OK", "body": decoded(text)}


def call(
    step: dict[str, Any],
    client: httpx.Client,
    bases: dict[str, str],
    channels: dict[str, grpc.Channel],
    stubs: Any,
) -> dict[str, Any]:
    """One step's answer, repeated while ``until: ready`` does not hold (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        if "rpc" in step:
            answer = _grpc_call(step, channels, stubs)
        else:
            body = step.get("body")
            response = client.request(
                step["method"],
                bases[step["listener"]] + step["path"],
                content=None if body is None else body.encode(),
                headers={"content-type": "text/plain"} if body is not None else {},
            )
            answer = {"status": response.status_code, "body": decoded(response.text)}
        if step.get("until") != "ready" or ready(answer["body"]):
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"{step['id']}: never ready: {answer}")
        time.sleep(0.2)
