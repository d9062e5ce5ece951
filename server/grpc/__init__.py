"""The gRPC listeners (grpcio's asyncio server, in the frontend process): the KServe v2 / Triton
``inference.GRPCInferenceService``, TorchServe's ``InferenceAPIsService`` and grpc's health
checking protocol (``health.py``) on the gRPC inference port (7070), TorchServe's
``ManagementAPIsService`` on the gRPC management port (7071).

Every RPC builds the same ``serving.protocol.WireRequest`` the HTTP listeners build and goes
through the same ``ModelVersion`` queue; errors are the same ``server.errors`` tree, mapped to
gRPC status codes in ``status.py``. Torch-free.
"""
