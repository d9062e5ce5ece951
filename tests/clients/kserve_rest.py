"""The KServe SDK's InferenceRESTClient against a live server, run as a child process (``kserve``
and ``tritonclient.grpc`` cannot share one): ``kserve_rest.py URL MODEL`` sends
``a = [[5, 7, 9]]``, ``b = [[1, 2, 3]]`` (b first), once as binary tensor data and once as JSON,
and prints ``{"binary": outputs, "json": outputs}``."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def infer(client: InferenceRESTClient, url: str, model: str, binary: bool) -> list[Any]:
    a = np.array([[5, 7, 9]], dtype=np.float32)
    b = np.array([[1, 2, 3]], dtype=np.float32)
    inputs = []
    for name, array in (("b", b), ("a", a)):
        tensor = InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    response = await client.infer(url, InferRequest(model, inputs), model_name=model)
    return [
        {"name": o.name, "datatype": o.datatype, "data": o.as_numpy().reshape(-1).tolist()}
        for o in response.outputs
    ]


async def main(url: str, model: str) -> None:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
    try:
        result = {
            "binary": await infer(client, url, model, True),
            "json": await infer(client, url, model, False),
        }
    finally:
        await client._client.aclose()
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
