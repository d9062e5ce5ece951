"""TorchServe's ``examples/micro_batching`` handler shape over the tiny model: ``handle`` is a
``MicroBatching`` (``ts.handler_utils.micro_batching``), micro-batches of 2, two threads for
preprocess and postprocess. A body is JSON ``{"value": v}``: the model runs on 64 copies of v and
the answer echoes v beside the model's first output and the micro-batch that carried it; v < 0
raises in inference, failing its micro-batch."""

from ts.handler_utils.micro_batching import MicroBatching
from ts.torch_handler.base_handler import BaseHandler


class MicroBatchingHandler(BaseHandler):
    def __init__(self):
        super().__init__()
        self.handle = MicroBatching(self)

    def initialize(self, context):
        super().initialize(context)
        self.handle.micro_batch_size = 2
        self.handle.parallelism = {"preprocess": 2, "inference": 1, "postprocess": 2}

    def preprocess(self, data):
        import torch

        values = [float((row.get("body") or row.get("data"))["value"]) for row in data]
        return values, torch.tensor(values).unsqueeze(1).repeat(1, 64)

    def inference(self, data, *args, **kwargs):
        import torch

        values, batch = data
        if min(values) < 0:
            raise ValueError("a negative value")
        with torch.no_grad():
            return values, self.model(batch), self.handle.get_micro_batch_idx()

    def postprocess(self, data):
        values, out, idx = data
        return [
            {"value": v, "out": float(row[0]), "micro_batch": idx}
            for v, row in zip(values, out, strict=True)
        ]
