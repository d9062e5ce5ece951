"""The handler of the ``/metrics?name[]=`` records (TorchServe 0.12 and torchbay load the same
file): each request observes 5 (ms) in the histogram ``LatH`` that metrics.yaml declares."""

from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler


class FilterHandler(BaseHandler):
    def handle(self, data, context):
        context.metrics.add_metric("LatH", 5, "ms", None, [], MetricTypes.HISTOGRAM)
        return [{"ok": True} for _ in data]
