"""The KServe SDK's InferenceRESTClient against a live server, run as a child process (``kserve``
and ``tritonclient.grpc`` cannot share one): ``kserve_rest.py URL MODEL [--binary]`` sends
``a = [[5, 7, 9]]``, ``b = [[1, 2, 3]]`` (b first) and prints the outputs as JSON."""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def main(url: str, model: str, binary: bool) -> None:
    a = np.array([[5, 7, 9]], dtype=np.float32)
    b = np.array([[1, 2, 3]], dtype=np.float32)
    inputs = []
    for name, array in (("b", b), ("a", a)):
        tensor = InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
    try:
        response = await client.infer(url, InferRequest(model, inputs), model_name=model)
    finally:
        await client._client.aclose()
    outputs = [
        {"name": o.name, "datatype": o.datatype, "data": o.as_numpy().reshape(-1).tolist()}
        for o in response.outputs
    ]
    print(json.dumps({"outputs": outputs}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], "--binary" in sys.argv[3:]))
