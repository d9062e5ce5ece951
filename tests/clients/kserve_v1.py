"""The kserve SDK's v1 REST client against a live server, run as a child process (``kserve``
and ``tritonclient.grpc`` cannot share one): ``kserve_v1.py URL READY_MODEL IDLE_MODEL``
prints the client's liveness, READY_MODEL's and IDLE_MODEL's readiness, an unknown model's
error status and ``GET /v1/models`` as one JSON object."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
from kserve import InferenceRESTClient, RESTConfig


async def main(url: str, ready: str, idle: str) -> dict[str, Any]:
    client = InferenceRESTClient(RESTConfig(protocol="v1", retries=0))
    try:
        out: dict[str, Any] = {
            "live": await client.is_server_live(url),
            "ready": await client.is_model_ready(url, ready),
            "idle": await client.is_model_ready(url, idle),
        }
        try:
            await client.is_model_ready(url, "no-such-model")
            out["unknown"] = None
        except httpx.HTTPStatusError as exc:
            out["unknown"] = exc.response.status_code
        out["models"] = (await client._client.get(f"{url}/v1/models")).json()
    finally:
        await client.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
