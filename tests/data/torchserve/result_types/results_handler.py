"""Answers each request with the kind of result its body names (``str``, ``bytes``, ``tensor``,
...), setting the response's content type, header or status where the kind says so. Written for
TorchServe (a module-level ``handle``), run unchanged by torchbay."""

import json

import torch


def _result(kind, idx, context):
    if kind == "typed_str":
        context.set_response_content_type(idx, "text/csv")
    if kind == "typed_bytes":
        context.set_response_content_type(idx, "image/png")
    if kind == "header":
        context.set_response_header(idx, "X-Custom", "v")
    if kind in ("created", "teapot", "teapot_none"):
        code, phrase = (201, "Made") if kind == "created" else (418, "Short and stout")
        context.set_response_status(code, phrase, idx)
    return {
        "str": "plain text",
        "json_str": json.dumps({"a": 1}),
        "typed_str": "a,b",
        "header": "with a header",
        "created": "made",
        "teapot": {"why": "a teapot"},
        "bytes": b"\x00\x01raw",
        "typed_bytes": b"\x89PNG",
        "dict": {"a": [1, 2.5]},
        "list": [1, 2],
        "number": 3,
        "none": None,
        "teapot_none": None,
        "tensor": torch.tensor([1.0, 2.0]),
    }[kind]


def handle(data, context):
    if data is None:  # TorchServe may call a module-level handle at load with None
        return None
    out = []
    for idx, row in enumerate(data):
        body = row.get("body")
        if isinstance(body, dict):  # a generate request's JSON (torchbay's test asks one)
            body = body.get("text_input")
        kind = body.decode() if isinstance(body, (bytes, bytearray)) else str(body)
        out.append(_result(kind, idx, context))
    return out
