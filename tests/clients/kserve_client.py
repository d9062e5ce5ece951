"""The kserve SDK's InferenceGRPCClient against a running server, in its own process (kserve and
tritonclient cannot be imported into one process: both register protobuf package ``inference``).

    python kserve_client.py HOST:PORT KEY MODEL [INFER_MODEL]

Prints one JSON object: live, ready, MODEL's readiness, an unknown model's error (its gRPC code
and details), the same call without the key, an inference on an unknown model, and with
INFER_MODEL an inference of ``x = [[1, 2]]`` (FP32, raw) on it: its outputs by name, or its
error. The test asserts on it.
"""

from __future__ import annotations

import asyncio
import json
import sys

import grpc
import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest


def _error(exc: BaseException) -> dict[str, str]:
    if isinstance(exc, grpc.aio.AioRpcError):
        return {"code": exc.code().name, "details": exc.details() or ""}
    return {"code": type(exc).__name__, "details": str(exc)}


async def main(url: str, key: str, model: str, infer_model: str = "") -> dict[str, object]:
    headers = [("authorization", f"Bearer {key}")] if key else None
    client = InferenceGRPCClient(url, timeout=30, retries=0)
    out: dict[str, object] = {
        "live": await client.is_server_live(headers=headers),
        "ready": await client.is_server_ready(headers=headers),
        "model_ready": await client.is_model_ready(model, headers=headers),
    }
    try:
        await client.is_model_ready("no-such-model", headers=headers)
        out["unknown"] = None
    except Exception as exc:
        out["unknown"] = _error(exc)
    try:
        await client.is_model_ready(model)  # no key
        out["no_key"] = None
    except Exception as exc:
        out["no_key"] = _error(exc)
    tensor = InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32), binary_data=True)
    try:
        result = await client.infer(
            InferRequest(model_name="no-such-model", infer_inputs=[tensor]), headers=headers
        )
        out["infer_unknown"] = {"outputs": [o.name for o in result.outputs]}
    except Exception as exc:
        out["infer_unknown"] = _error(exc)
    if infer_model:
        out["infer"] = await _infer(client, infer_model, tensor, headers)
    await client.close()
    return out


async def _infer(client: InferenceGRPCClient, model: str, tensor: InferInput, headers) -> object:
    try:
        result = await client.infer(
            InferRequest(model_name=model, infer_inputs=[tensor]), headers=headers
        )
    except Exception as exc:
        return _error(exc)
    return {o.name: o.as_numpy().tolist() for o in result.outputs}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:5]))))
