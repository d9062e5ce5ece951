"""A test handler for cancellation (a module-level ``handle``). Each request is the JSON object
``{"id": str, "log": path, "gate": path}`` (``gate`` optional), sent as TorchServe's body or
``data`` input, or as the only (BYTES) input of an Open Inference Protocol request.

A batch first appends each of its requests' ids to ``log``, one line each (so the file lists
exactly the requests the handler ran, in order, and a test can see a batch has started), then
waits for every ``gate`` file to exist (the test creates it), then answers each request
``{"id", "pid"}``. Every wait polls with a bounded deadline.
"""

from __future__ import annotations

import os

from gates import json_body, wait_open  # packed beside this file (tests/server/assets/gates.py)


def handle(data, context):
    if data is None:  # initialization
        return None
    bodies = [json_body(row) for row in data]
    with open(bodies[0]["log"], "a") as log:
        log.writelines(f"{body['id']}\n" for body in bodies)
    for body in bodies:
        wait_open(body.get("gate"))
    return [{"id": body["id"], "pid": os.getpid()} for body in bodies]
