"""The function nodes of the recorded workflows (TorchServe calls ``name(data, context)``)."""

import json


def pre_processing(data, context):
    """The start node: checks the request and passes it on (fan-out to the models)."""
    if data is None:  # TorchServe calls every function once at load, with None
        return None
    out = []
    for row in data:
        body = row.get("body") if row.get("body") is not None else row.get("data")
        values = body if isinstance(body, dict) else json.loads(bytes(body))
        if values.get("fail") == "pre_processing":
            raise ValueError("pre_processing refused the input")
        out.append(json.dumps(values))
    return out


def aggregate(data, context):
    """The fan-in node: its parents' outputs come by their node names."""
    if data is None:
        return None
    out = []
    for row in data:
        double = json.loads(bytes(row["double"]))["double"]
        square = json.loads(bytes(row["square"]))["square"]
        total = [a + b for a, b in zip(double, square, strict=True)]
        out.append({"sum": total, "inputs": sorted(row)})
    return out
