"""The handler of the metrics-mode records (TorchServe 0.12 and torchbay load the same file).

A ``BaseHandler`` subclass, so that TorchServe's own ``handle`` adds ``HandlerTime``; it answers
``{"ok": true}`` per request, raises a 400 ``PredictionException`` on the body ``bad``, and adds
the custom counter ``InferenceCount`` (one per request, dimension ``Color``) that
``metrics_config`` and ``model_metrics_auto_detect`` decide the fate of.
"""

from ts.metrics.dimension import Dimension
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException


class MetricsHandler(BaseHandler):
    def preprocess(self, data):
        bodies = [row.get("data") or row.get("body") for row in data]
        # TorchServe hands a text/plain body over as str, torchbay as bytes
        if any((b.encode() if isinstance(b, str) else bytes(b)) == b"bad" for b in bodies):
            raise PredictionException("bad input", 400)
        return bodies

    def inference(self, data, *args, **kwargs):
        self.context.metrics.add_counter(
            "InferenceCount", len(data), None, [Dimension("Color", "blue")]
        )
        return data

    def postprocess(self, data):
        return [{"ok": True} for _ in data]
