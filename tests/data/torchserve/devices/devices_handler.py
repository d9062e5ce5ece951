"""Reports what the worker was given: ``gpu_id`` and the device TorchServe's BaseHandler chose.
Runs in TorchServe (the recorder) and in torchbay (tests/server/test_devices_live.py)."""

import torch

try:
    from ts.torch_handler.base_handler import BaseHandler
except ImportError:  # torchbay without the worker's ts alias (a direct import)
    from torchbay.handlers.base_handler import BaseHandler


class DevicesHandler(BaseHandler):
    def handle(self, data, context):
        gpu_id = context.system_properties.get("gpu_id")
        report = {"gpu_id": gpu_id, "device": str(self.device), "cuda": torch.cuda.is_available()}
        return [report for _ in data]
