"""A user's ``code/inference.py`` in the SageMaker PyTorch toolkit's layout (model.pth beside
``code/``): the toolkit's handler service finds ``model_fn``, ``input_fn``, ``predict_fn`` and
``output_fn`` here. The model is a 3 -> 2 linear layer; ``model.pth`` holds its state dict."""

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


def input_fn(request_body, request_content_type):
    if request_content_type != "application/json":
        raise ValueError("this model takes application/json, not " + str(request_content_type))
    return torch.tensor(json.loads(request_body), dtype=torch.float32)


def predict_fn(input_data, model):
    with torch.no_grad():
        return model(input_data)


def output_fn(prediction, accept):
    return json.dumps({"scores": prediction.tolist()})
