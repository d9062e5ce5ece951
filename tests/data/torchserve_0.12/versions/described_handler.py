"""A TorchServe BaseHandler with its own ``describe_handle``: what ``GET /models/m?customized=true``
answers as ``customizedMetadata`` (TorchServe 0.12 and torchbay load the same file)."""

import json

from ts.torch_handler.base_handler import BaseHandler


class Described(BaseHandler):
    def initialize(self, context):
        self.context = context
        self.initialized = True

    def preprocess(self, data):
        return data

    def inference(self, data):
        return data

    def postprocess(self, data):
        return [{"ok": True} for _ in data]

    def describe_handle(self):
        return json.dumps({"classes": 2, "note": "custom"})
