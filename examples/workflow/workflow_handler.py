"""The read_digit workflow's function node (TorchServe calls ``best(data, context)``).

``best`` gets the digits node's answer as bytes (a workflow node gets its parent's output as
bytes) and answers the most likely digit with its probability and the top 3 it chose from.
"""

import json


def best(data, context):
    if data is None:  # TorchServe calls every function once at load, with None
        return None
    out = []
    for row in data:
        top3 = json.loads(bytes(row["body"]))
        digit = max(top3, key=top3.get)
        out.append({"digit": digit, "probability": top3[digit], "top3": top3})
    return out
