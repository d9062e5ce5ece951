"""Our error tree as gRPC status codes (TorchServe's GRPCUtils table), the details a handler's
error body gives, the gRPC settings' bounds, and a taken gRPC port failing start-up early."""

from __future__ import annotations

import socket

import grpc
import pytest
from pydantic import ValidationError

from torchbay.server import errors
from torchbay.server.config.settings import ServerConfig
from torchbay.server.grpc.status import code_for, error_message, from_error
from torchbay.server.http.listeners import bind_listeners

C = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.BadRequest, C.INVALID_ARGUMENT),
        (errors.InvalidModelVersion, C.INVALID_ARGUMENT),
        (errors.ClientDisconnected, C.CANCELLED),
        (errors.Unauthorized, C.UNAUTHENTICATED),
        (errors.Forbidden, C.PERMISSION_DENIED),
        (errors.DefaultVersionInUse, C.PERMISSION_DENIED),
        (errors.ModelNotFound, C.NOT_FOUND),
        (errors.ModelVersionNotFound, C.NOT_FOUND),
        (errors.MethodNotAllowed, C.FAILED_PRECONDITION),
        (errors.Conflict, C.ABORTED),
        (errors.PayloadTooLarge, C.RESOURCE_EXHAUSTED),
        (errors.HandlerFailed, C.INTERNAL),
        (errors.QueueFull, C.UNAVAILABLE),
        (errors.NoWorker, C.UNAVAILABLE),
        (errors.WorkerDied, C.UNAVAILABLE),
        (errors.ShuttingDown, C.UNAVAILABLE),
        (errors.RequestTimeout, C.DEADLINE_EXCEEDED),
        (errors.TorchbayError, C.INTERNAL),
    ],
)
def test_every_error_of_the_tree_has_its_code_and_keeps_its_message(error, code) -> None:
    mapped = from_error(error("what happened"))
    assert (mapped.code, mapped.details, mapped.http_status) == (code, "what happened",
                                                                 error.status)  # fmt: skip


def test_handler_statuses_outside_the_table() -> None:
    assert code_for(200) is C.OK and code_for(422) is C.FAILED_PRECONDITION
    assert code_for(507) is C.INTERNAL and code_for(429) is C.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"code": 400, "type": "BadInput", "message": "no good"}', "no good"),
        (b'{"error": "v2 says no"}', "v2 says no"),
        (b"plain words", "plain words"),
        (b"", "The model answered HTTP status 418"),
        (b'{"message": ""}', '{"message": ""}'),
    ],
)
def test_the_details_are_the_error_body_message(body: bytes, message: str) -> None:
    assert error_message(418, body) == message


def test_grpc_settings_are_bounded() -> None:
    config = ServerConfig(grpc_inference_address="[::1]", grpc_management_address="localhost")
    assert (config.grpc_inference_address, config.grpc_management_address) == ("::1", "localhost")
    assert (config.grpc_inference_port, config.grpc_management_port) == (7070, 7071)
    for bad in (
        {"grpc_inference_port": 70000},
        {"grpc_management_address": "http://127.0.0.1:7071"},
        {"grpc_inference_max_connection_age_ms": 0},
        {"enable_grpc_ssl": True},  # without the key and certificate
    ):
        with pytest.raises(ValidationError):
            ServerConfig(**bad)


def test_a_taken_grpc_port_fails_binding_with_one_line_naming_it() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    config = ServerConfig(
        inference_address="http://127.0.0.1:0", management_address="http://127.0.0.1:0",
        metrics_address="http://127.0.0.1:0", grpc_inference_port=0, grpc_management_port=port,
    )  # fmt: skip
    with pytest.raises(errors.TorchbayError) as info:
        bind_listeners(config)
    taken.close()
    assert str(info.value) == (
        f"cannot listen on 127.0.0.1:{port} (gRPC management): address already in use"
    )
