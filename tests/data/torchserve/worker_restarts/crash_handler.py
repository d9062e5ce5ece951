"""A handler whose worker dies (os._exit(5)) on a request whose body is "crash"; any other
request answers the worker's pid."""

import os


def handle(data, context):
    if data is None:  # TorchServe's initialization call of a module-level handler
        return None
    out = []
    for row in data:
        body = row.get("body") or row.get("data")
        if isinstance(body, (bytes, bytearray)):
            body = body.decode()
        if body == "crash":
            os._exit(5)
        out.append(str(os.getpid()))
    return out
