"""The worker process (``python -m torchbay.server.worker --fd N``): where a batch runs.

``main`` reads ``Load``/``Infer`` frames from ``serving.protocol``, loads the handler through
``torchbay.handlers`` and answers ``Result`` frames. The only server package that imports torch;
it imports nothing of the frontend but the protocol (and the log formatter).
"""
