"""A handler that logs and prints each request's text, as many of TorchServe's examples log
their input (``logger.info("Received text: '%s'", text)``): the client's line breaks reach the
worker's output. Standard library only: TorchServe 0.12 and torchbay both load it."""

import logging
import os

logger = logging.getLogger(__name__)


class EchoHandler:
    def initialize(self, context):
        self.initialized = True

    def handle(self, data, context):
        out = []
        for row in data:
            body = row.get("data") or row.get("body")
            text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else str(body)
            logger.info("Received text: '%s'", text)
            print("input:", text, flush=True)
            print("secret seen:", os.environ.get("_TORCHBAY_LOG_TAG"), flush=True)
            out.append("ok")
        return out
