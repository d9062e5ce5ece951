"""The gRPC listeners' lifecycle: bind, register the services, start, stop.

TorchServe's layout: the inference services (``inference.GRPCInferenceService``, TorchServe's
``InferenceAPIsService`` and, as Triton, grpc's ``grpc.health.v1.Health``: ``health.py``) on
``grpc_inference_address:grpc_inference_port`` (7070), the
management service on ``grpc_management_address:grpc_management_port`` (7071); one server holds
all three when both name the same address. ``enable_grpc_ssl`` serves TLS with
``private_key_file`` / ``certificate_file``. A request message is bounded by ``max_request_size``
(grpc answers RESOURCE_EXHAUSTED past it); a model's answer is bounded by ``max_response_size``
where every protocol's is (the plane's 500 past it), so the message around it (the tensors'
names, shapes, the request's id) is not bounded again here: a limit of ``max_response_size`` on
the whole message failed answers of just under it that REST serves. SO_REUSEPORT is off, so a
port in use fails start-up instead of sharing the port with another server.

Binding happens in ``bind`` (before the key file is written or a model loads); the services are
added and the servers started in ``start``; ``stop`` stops accepting and lets calls in flight
finish for the grace period (the registry's drain answers what is still queued), and the
client streams end once their requests are answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from torchbay.server.config.settings import ServerConfig
from torchbay.server.errors import TorchbayError
from torchbay.server.grpc import messages
from torchbay.server.grpc.calls import Calls, Service
from torchbay.server.grpc.health import HealthService
from torchbay.server.grpc.management import TorchServeManagement
from torchbay.server.grpc.oip import OipService
from torchbay.server.grpc.torchserve import TorchServeInference

log = logging.getLogger("torchbay.grpc")

# Every RPC is read as a client stream (one_request); by whether the server streams:
_KINDS = {False: grpc.stream_unary_rpc_method_handler, True: grpc.stream_stream_rpc_method_handler}


def _client_metadata_is_no_error(record: logging.LogRecord) -> bool:
    """grpc logs a call's metadata value that is not UTF-8 (the client's choice) as an ERROR with
    a traceback each time the metadata is read, then reads it as Latin-1: a client could fill
    the log with tracebacks that look like bugs of ours. Those records are dropped."""
    return not record.getMessage().startswith("Invalid encoding on ")


def grpc_target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Malformed(Exception):
    """A request message that does not parse as its type: the client's INVALID_ARGUMENT.

    The deserializer hands the RPC this object instead of raising (grpc would answer a unary
    call UNKNOWN "Unexpected <class DecodeError>", and a streaming method would fail on it as on
    a bug of ours); ``guarded`` answers it, or raises it where a client stream yields it."""

    def __init__(self, type_name: str) -> None:
        super().__init__(f"The request is not a valid {type_name} message")


def deserializer(message_class: Any) -> Any:
    """``message_class.FromString``, a ``Malformed`` for bytes that do not parse."""
    name = message_class.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except DecodeError:
            return Malformed(name)

    return parse


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A client stream whose malformed message ends it with that message's ``Malformed``."""
    async for request in requests:
        if isinstance(request, Malformed):
            raise request
        yield request


def guarded(function: Any, streams: bool, rpc: str, client_streams: bool = False) -> Any:
    """``function`` answering INTERNAL "Internal server error" for a bug of ours (logged with
    its traceback), never grpc's default UNKNOWN with the exception's text; a request message
    that does not parse is INVALID_ARGUMENT (``Malformed``)."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await function(_request(request, client_streams), context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:
            await _failed(exc, context, rpc)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in function(_request(request, client_streams), context):
                yield item
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:
            await _failed(exc, context, rpc)

    return stream if streams else unary


async def _failed(exc: Exception, context: grpc.aio.ServicerContext, rpc: str) -> None:
    """End the call for ``exc`` (raised inside it, so still being handled): a request that did
    not parse is the client's INVALID_ARGUMENT, anything else a bug of ours (logged)."""
    if isinstance(exc, Malformed):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    log.error("gRPC %s failed", rpc, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, "Internal server error")


def _request(request: Any, client_streams: bool) -> Any:
    """The request as the RPC takes it: a client stream checked as it is read; a single
    message raised when it is ``Malformed``."""
    if client_streams:
        return _checked(request)
    if isinstance(request, Malformed):
        raise request
    return request


def one_request(function: Any, streams: bool, method: str) -> Any:
    """``function`` of one request message, served as a client stream from which it reads that
    message: grpc.aio never answers a unary call whose client half-closed without one (it hung
    until the client's deadline, for ever without one). Such a call is UNIMPLEMENTED, in the
    words of grpc's own synchronous server; messages past the first are not read."""

    async def first(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async for request in requests:
            return request
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, f'"{method}" requires exactly one request message.'
        )

    async def unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await function(await first(requests, context), context)

    async def stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async for item in function(await first(requests, context), context):
            yield item

    return stream if streams else unary


def generic_handler(service: str, implementations: dict[str, Any]) -> grpc.GenericRpcHandler:
    """A service's RPCs (message classes from the private pool) as a generic handler, each read
    as a client stream (:func:`one_request`); RPCs of the proto left out answer UNIMPLEMENTED."""
    methods = {}
    for name, function in implementations.items():
        request, response, client_streams, server_streams = messages.method_types(service, name)
        served = guarded(function, server_streams, f"{service}/{name}", client_streams)
        if not client_streams:
            served = one_request(served, server_streams, f"/{service}/{name}")
        methods[name] = _KINDS[server_streams](
            served,
            request_deserializer=deserializer(request),
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service, methods)


@dataclass
class GrpcListeners:
    """The bound gRPC servers: ``ports`` (listener name -> port) once bound."""

    config: ServerConfig
    servers: dict[str, grpc.aio.Server] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    calls: Calls | None = None  # once started

    def bind(self) -> None:
        """Create the servers and bind their ports; TorchbayError naming the listener."""
        config = self.config
        logging.getLogger("grpc._cython.cygrpc").addFilter(_client_metadata_is_no_error)
        options = [
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", config.max_request_size),
            ("grpc.max_send_message_length", -1),  # the answer's own bound: see the docstring
        ]
        addresses = {
            "inference": (config.grpc_inference_address, config.grpc_inference_port),
            "management": (config.grpc_management_address, config.grpc_management_port),
        }
        shared = addresses["inference"] == addresses["management"] and addresses["inference"][1]
        for name, (host, port) in addresses.items():
            if shared and name == "management":
                self.servers[name], self.ports[name] = (
                    self.servers["inference"],
                    self.ports["inference"],
                )
                continue
            server = grpc.aio.server(options=[*options, *self._age_options(name)])
            self.ports[name] = self._add_port(server, name, host, port)
            self.servers[name] = server

    def _age_options(self, name: str) -> list[tuple[str, int]]:
        options = []
        age = getattr(self.config, f"grpc_{name}_max_connection_age_ms")
        grace = getattr(self.config, f"grpc_{name}_max_connection_age_grace_ms")
        if age is not None:
            options.append(("grpc.max_connection_age_ms", age))
        if grace is not None:
            options.append(("grpc.max_connection_age_grace_ms", grace))
        return options

    def _add_port(self, server: grpc.aio.Server, name: str, host: str, port: int) -> int:
        target = grpc_target(host, port)
        try:
            if self.config.enable_grpc_ssl:
                key = self.config.private_key_file.read_bytes()  # type: ignore[union-attr]
                cert = self.config.certificate_file.read_bytes()  # type: ignore[union-attr]
                bound = server.add_secure_port(target, grpc.ssl_server_credentials([(key, cert)]))
            else:
                bound = server.add_insecure_port(target)
        except (RuntimeError, OSError) as exc:
            raise TorchbayError(f"cannot listen on {target} (gRPC {name}): {exc}") from None
        if not bound:  # older grpcio returns 0 instead of raising
            raise TorchbayError(f"cannot listen on {target} (gRPC {name}): address in use")
        return bound

    async def start(self, calls: Calls) -> None:
        """Register the services on the bound servers and start them."""
        self.calls = calls
        services: dict[str, tuple[Service, ...]] = {
            "inference": (OipService(calls), TorchServeInference(calls), HealthService(calls)),
            "management": (TorchServeManagement(calls, calls.plane.management),),
        }
        for listener, implementations in services.items():
            self.servers[listener].add_generic_rpc_handlers(
                tuple(generic_handler(s.name, s.handlers()) for s in implementations)
            )
        for server in {id(s): s for s in self.servers.values()}.values():
            await server.start()

    async def stop(self, grace: float) -> None:
        """Stop taking calls; the calls in flight have ``grace`` seconds. A client stream ends
        once the requests it sent are answered (``calls.ClientStream``): one that its client
        keeps open does not hold the stop for the whole grace."""
        if self.calls is not None:
            self.calls.closing.set()
        for server in {id(s): s for s in self.servers.values()}.values():
            await server.stop(grace)
