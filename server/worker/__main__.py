"""``python -m torchbay.server.worker --fd N``: the worker process's entry point."""

from torchbay.server.worker.main import start

start()
