"""The message classes of the shipped protos, from a PRIVATE descriptor pool.

``protos/services.binpb`` is the compiled descriptor set of Triton's ``grpc_service.proto`` (the
KServe v2 protocol and its extensions) and TorchServe's ``inference.proto`` and
``management.proto`` (``scripts/gen_grpc.sh`` regenerates it from those ``.proto`` files, kept
as their projects ship them in ``protos/third_party/``).
It is loaded into its own ``DescriptorPool``, never protobuf's default pool: tritonclient and the
kserve SDK each register package ``inference`` there under different file names, and a server
that registered it too would make one of them fail to import in the same process.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTOS = Path(__file__).parent / "protos" / "third_party"  # the .proto files (third-party text)
DESCRIPTOR_SET = PROTOS.parent / "services.binpb"

OIP_SERVICE = "inference.GRPCInferenceService"
TS_INFERENCE_SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
TS_MANAGEMENT_SERVICE = "org.pytorch.serve.grpc.management.ManagementAPIsService"
HEALTH_SERVICE = "grpc.health.v1.Health"  # grpc's health checking protocol (health.py)


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    private = descriptor_pool.DescriptorPool()
    for proto in files.file:  # --include_imports lists dependencies first
        private.Add(proto)
    private.Add(_health_file())
    return private


def _health_file() -> descriptor_pb2.FileDescriptorProto:
    """grpc's health checking protocol (package ``grpc.health.v1``): its two messages and its
    service, described here (the protocol is grpc's documented wire format)."""
    field = descriptor_pb2.FieldDescriptorProto
    package = HEALTH_SERVICE.rsplit(".", 1)[0]
    health = descriptor_pb2.FileDescriptorProto(
        name="torchbay/grpc_health_v1.proto", package=package, syntax="proto3"
    )
    request = health.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    response = health.message_type.add(name="HealthCheckResponse")
    states = response.enum_type.add(name="ServingStatus")
    for number, state in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        states.value.add(name=state, number=number)
    response.field.add(
        name="status",
        number=1,
        type=field.TYPE_ENUM,
        type_name=f".{package}.HealthCheckResponse.ServingStatus",
        label=field.LABEL_OPTIONAL,
    )
    service = health.service.add(name="Health")
    for rpc, streams in (("Check", False), ("Watch", True)):
        service.method.add(
            name=rpc,
            input_type=f".{package}.HealthCheckRequest",
            output_type=f".{package}.HealthCheckResponse",
            server_streaming=streams,
        )
    return health


@functools.cache
def message(full_name: str) -> type[Any]:
    """The message class of ``full_name`` (e.g. ``inference.ModelInferRequest``)."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))


def method_types(service: str, method: str) -> tuple[type[Any], type[Any], bool, bool]:
    """(request class, response class, client streams, server streams) of one RPC."""
    desc = pool().FindServiceByName(service).methods_by_name[method]
    return (
        message(desc.input_type.full_name),
        message(desc.output_type.full_name),
        desc.client_streaming,
        desc.server_streaming,
    )
