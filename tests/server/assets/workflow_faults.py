"""Function nodes that fail in the ways a workflow must survive (test_workflows_live.py).

``count`` appends a line to the file the request names, then raises when asked to: the number of
lines is the number of times the node ran. ``nap`` takes longer than its node's ``timeout-ms``.
``crash`` ends its worker process. ``echo`` passes the request on. ``passthrough`` (and
``relay``) pass the request's raw bytes on, ``constant`` answers ``constant``, and ``fields`` (a
fan-in node) answers the fields it got as a JSON object of latin-1 text. ``flood`` streams 1 MB
parts, as many as the request's ``parts`` (a node's stream is gathered into its output).
"""

import json
import os
import time

from ts.protocol.otf_message_handler import send_intermediate_predict_response


def _rows(data):
    for row in data:
        body = row.get("body") if row.get("body") is not None else row.get("data")
        yield body if isinstance(body, dict) else json.loads(bytes(body))


def count(data, context):
    if data is None:
        return None
    out = []
    for values in _rows(data):
        with open(values["log"], "a") as fh:
            fh.write("ran\n")
        if values.get("fail"):
            raise ValueError("count was asked to fail")
        out.append(json.dumps(values))
    return out


def nap(data, context):
    if data is None:
        return None
    time.sleep(3)  # past the node's timeout-ms (300): the workflow gives up before this ends
    return ["late" for _ in data]


def crash(data, context):
    if data is None:
        return None
    os._exit(3)


def echo(data, context):
    if data is None:
        return None
    return [json.dumps(values) for values in _rows(data)]


def _raw(row):
    body = row.get("body") if row.get("body") is not None else row.get("data")
    return bytes(body or b"")


def passthrough(data, context):
    if data is None:
        return None
    return [_raw(row) for row in data]


def relay(data, context):
    return passthrough(data, context)


def constant(data, context):
    if data is None:
        return None
    return [b"constant" for _ in data]


def fields(data, context):
    if data is None:
        return None
    return [json.dumps({k: bytes(v).decode("latin-1") for k, v in row.items()}) for row in data]


def flood(data, context):
    if data is None:
        return None
    for values in _rows(data):
        for _ in range(values["parts"]):
            part = [b"y" * 1_000_000]
            send_intermediate_predict_response(part, context.request_ids, "Part", 200, context)
    return [b"end" for _ in data]
