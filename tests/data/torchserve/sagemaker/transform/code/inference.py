"""A user's ``code/inference.py`` with ``transform_fn`` (the toolkit's other contract: one
function from request body to response, instead of input_fn/predict_fn/output_fn). The model
and ``model.pth`` are those of ../../model/code/inference.py."""

import json
import os

import torch


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.linear(x)


def model_fn(model_dir):
    model = TinyNet()
    state = torch.load(os.path.join(model_dir, "model.pth"), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def transform_fn(model, request_body, content_type, accept):
    rows = json.loads(request_body)
    with torch.no_grad():
        scores = model(torch.tensor(rows, dtype=torch.float32))
    return json.dumps({"transformed": scores.tolist(), "accept": accept}), "application/json"
