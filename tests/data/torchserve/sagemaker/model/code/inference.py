"""A user's ``code/inference.py`` in the SageMaker PyTorch toolkit's layout (model.pth beside
``code/``): the toolkit's handler service finds ``model_fn``, ``input_fn``, ``predict_fn`` and
``output_fn`` here. The model and ``model_fn`` are tiny_net.py's (a 3 -> 2 linear layer,
``model.pth`` its state dict), copied beside this file into the model directory's ``code/``."""

import json

import torch
from tiny_net import model_fn  # noqa: F401  (the toolkit looks it up here; tiny_net.py is beside)


def input_fn(request_body, request_content_type):
    if request_content_type != "application/json":
        raise ValueError("this model takes application/json, not " + str(request_content_type))
    return torch.tensor(json.loads(request_body), dtype=torch.float32)


def predict_fn(input_data, model):
    with torch.no_grad():
        return model(input_data)


def output_fn(prediction, accept):
    return json.dumps({"scores": prediction.tolist()})
