"""A function handler that answers each request with the row it received (bytes as text): shows
what a request, e.g. a KServe v1 instance, becomes on the handler's side."""

from __future__ import annotations


def handle(data, context):
    if data is None:  # TorchServe calls handle(None, context) once to initialise
        return None
    return [
        {k: v.decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else v
         for k, v in row.items()}
        for row in data
    ]  # fmt: skip
