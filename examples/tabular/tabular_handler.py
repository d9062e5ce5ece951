"""A batched tabular handler, written against TorchServe's API (``ts.*`` imports).

Each request is one row: a JSON list of the 4 iris features, or an object with the feature names
(``{"sepal length (cm)": 5.1, ...}``). The whole batch goes through the model in one call; each
response is ``{"label": ..., "probabilities": {label: p}}``. A row that is not 4 finite numbers
fails alone with 400 (torchbay's ``BaseHandler.map_items``); the others in its batch are
answered. ``X-Batch-Size`` on each response says how many requests shared its handler call.
"""

import json
import math

import torch
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException

FEATURES = ["sepal length (cm)", "sepal width (cm)", "petal length (cm)", "petal width (cm)"]


class TabularHandler(BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        with open(f"{context.system_properties['model_dir']}/index_to_name.json") as f:
            names = json.load(f)
        self.labels = [names[str(i)] for i in range(len(names))]

    def _row(self, request):
        value = request.get("data") if request.get("data") is not None else request.get("body")
        if isinstance(value, (bytes, bytearray)):  # a body sent without a JSON content type
            try:
                value = json.loads(value)
            except ValueError:  # not JSON, or not UTF-8: the client's mistake, not ours
                raise PredictionException(
                    "a row is JSON: 4 numbers or {name: value}", 400
                ) from None
        if isinstance(value, dict):
            missing = [name for name in FEATURES if name not in value]
            if missing:
                raise PredictionException(f"missing features: {missing}", 400)
            value = [value[name] for name in FEATURES]
        if not isinstance(value, list) or len(value) != len(FEATURES):
            raise PredictionException(f"send {len(FEATURES)} numbers or {{name: value}}", 400)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in value):
            raise PredictionException("features must be finite numbers", 400)
        return [float(v) for v in value]

    def preprocess(self, data):
        # map_items answers a bad row alone (400) and keeps the rest of the batch.
        rows = self.map_items(data, self._row)
        self.batch_len = len(data)
        return torch.tensor(rows, dtype=torch.float32)

    def postprocess(self, logits):
        probs = torch.softmax(logits.float(), dim=1).tolist()
        out = []
        for j, row in enumerate(probs):
            # Result j answers request kept_indices[j] (the rows map_items kept).
            idx = self.kept_indices[j]
            self.context.set_response_header(idx, "X-Batch-Size", str(self.batch_len))
            best = max(range(len(row)), key=row.__getitem__)
            out.append(
                {
                    "label": self.labels[best],
                    "probabilities": dict(zip(self.labels, row, strict=True)),
                }
            )
        return out
