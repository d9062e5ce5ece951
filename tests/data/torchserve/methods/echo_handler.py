"""A TorchServe handler (BaseHandler's ``handle``, so HandlerTime is its own) that loads no
model: each request is answered ``{"bytes": <its body's length>}``; a describe (``describe:
True``) ``{"described": true}``."""

import json

from ts.torch_handler.base_handler import BaseHandler


class EchoHandler(BaseHandler):
    def initialize(self, context):
        self.context = context
        self.manifest = context.manifest
        self.initialized = True

    def preprocess(self, data):
        return data

    def inference(self, data, *args, **kwargs):
        out = []
        for row in data:
            body = row.get("body", row.get("data")) if isinstance(row, dict) else row
            if isinstance(body, (bytes, bytearray)):
                size = len(body)
            elif body is None:
                size = 0
            else:
                size = len(json.dumps(body))
            out.append(json.dumps({"bytes": size}))
        return out

    def postprocess(self, data):
        return data

    def describe_handle(self):
        return json.dumps({"described": True})
