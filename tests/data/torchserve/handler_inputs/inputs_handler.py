"""What a TorchServe handler receives: answers, per request, each key of its input row with the
value's type and value (bytes as latin-1 text), and what ``context.get_request_header`` gives for
a few header and parameter names. Written for TorchServe (a module-level ``handle``), run
unchanged by torchbay."""

import json

# Request headers, then the input parameters' names: TorchServe files each parameter's content
# type among the request's headers, as {"content-type": ...} under the parameter's name.
HEADERS = ("X-Probe", "x-probe", "Content-Type", "X-Missing")
PARAMETERS = ("body", "field", "typed", "file", "textfile", "jsonfile", "plainfile", "a")


def _value(value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    return value


def _header(context, idx, name):
    value = context.get_request_header(idx, name)
    return [type(value).__name__, value]


def handle(data, context):
    if data is None:  # TorchServe may call a module-level handle at load with None
        return None
    out = []
    for idx, row in enumerate(data):
        keys = [[key, type(value).__name__, _value(value)] for key, value in row.items()]
        headers = {name: _header(context, idx, name) for name in HEADERS + PARAMETERS}
        out.append(json.dumps({"row": keys, "headers": headers}))
    return out
