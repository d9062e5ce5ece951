"""The model nodes of the recorded workflows: one tiny torch model made in code per archive,
chosen by the model's name (``double``: a 1x1 linear layer of weight 2; ``square``: x * x).

Input: ``{"values": [numbers], "fail": "<node>"}`` as bytes (a workflow node gets its parent's
output as bytes); output one JSON object per request. ``fail`` naming this model makes it raise,
so that a failing node's answer can be recorded.
"""

import json

import torch


def _model(name):
    if name.endswith("double"):
        layer = torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            layer.weight.fill_(2.0)
        return layer
    return lambda x: x * x


_MODELS = {}


def handle(data, context):
    if data is None:  # TorchServe calls a module-level handle once at load, with None
        return None
    name = context.manifest["model"]["modelName"]
    model = _MODELS.setdefault(name, _model(name))
    kind = "double" if name.endswith("double") else "square"
    out = []
    for row in data:
        body = row.get("body") if row.get("body") is not None else row.get("data")
        values = body if isinstance(body, dict) else json.loads(bytes(body))
        if values.get("fail") == kind:
            raise ValueError(f"{kind} refused the input")
        with torch.no_grad():
            x = torch.tensor(values["values"], dtype=torch.float32).reshape(-1, 1)
            y = model(x).reshape(-1).tolist()
        out.append({kind: y})
    return out
