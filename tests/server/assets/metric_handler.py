"""A test handler that records the custom metrics each request asks for, through context.metrics.

A request is a JSON object ``{"metrics": [{"name", "value", "type"?, "unit"?, "dims"?}, ...]}``;
each entry becomes one ``context.metrics.add_metric`` call (TorchServe's API). The answer is
``{"batch": n}``. The archive's model is loaded but not run.
"""

from __future__ import annotations

from torchbay.handlers.base_handler import BaseHandler


class MetricHandler(BaseHandler):
    def handle(self, data, context):
        out = []
        for item in data:
            body = item.get("body") if isinstance(item, dict) else None
            for m in (body or {}).get("metrics", []):
                context.metrics.add_metric(
                    m["name"],
                    m["value"],
                    m.get("unit", "count"),
                    dimensions=m.get("dims"),
                    metric_type=m.get("type", "counter"),
                )
            out.append({"batch": len(data)})
        return out
