"""A user's ``code/inference.py`` with ``transform_fn`` (the toolkit's other contract: one
function from request body to response, instead of input_fn/predict_fn/output_fn). The model,
``model_fn`` and ``model.pth`` are those of ../../model/code/inference.py (tiny_net.py's)."""

import json

import torch
from tiny_net import model_fn  # noqa: F401  (the toolkit looks it up here; tiny_net.py is beside)


def transform_fn(model, request_body, content_type, accept):
    rows = json.loads(request_body)
    with torch.no_grad():
        scores = model(torch.tensor(rows, dtype=torch.float32))
    return json.dumps({"transformed": scores.tolist(), "accept": accept}), "application/json"
