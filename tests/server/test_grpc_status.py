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

from .conftest import probe_models

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


def test_a_bug_of_ours_is_internal_without_its_text() -> None:
    """A method that raises an unexpected exception answers INTERNAL "Internal server error"
    (grpc's default would be UNKNOWN with the exception's text), unary and streaming alike."""
    from torchbay.server.grpc import messages
    from torchbay.server.grpc.server import generic_handler

    async def boom(request, context):
        raise KeyError("/secret/path/in/the/message")

    async def boom_stream(requests, context):
        raise KeyError("/secret/path/in/the/message")
        yield  # an async generator

    async def run() -> list[tuple[grpc.StatusCode, str]]:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        handlers = {"ServerLive": boom, "ModelStreamInfer": boom_stream}
        server.add_generic_rpc_handlers((generic_handler(messages.OIP_SERVICE, handlers),))
        await server.start()
        live_req, live_resp, *_ = messages.method_types(messages.OIP_SERVICE, "ServerLive")
        infer_req, infer_resp, *_ = messages.method_types(messages.OIP_SERVICE, "ModelStreamInfer")
        out = []
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            live = channel.unary_unary(f"/{messages.OIP_SERVICE}/ServerLive",
                                       request_serializer=live_req.SerializeToString,
                                       response_deserializer=live_resp.FromString)  # fmt: skip
            stream = channel.stream_stream(f"/{messages.OIP_SERVICE}/ModelStreamInfer",
                                           request_serializer=infer_req.SerializeToString,
                                           response_deserializer=infer_resp.FromString)  # fmt: skip
            for call in (lambda: live(live_req(), timeout=10),
                         lambda: _drain(stream(iter([infer_req()]), timeout=10))):  # fmt: skip
                try:
                    await call()
                except grpc.aio.AioRpcError as exc:
                    out.append((exc.code(), exc.details()))
        await server.stop(None)
        return out

    async def _drain(call) -> None:
        async for _ in call:
            pass

    import asyncio

    assert asyncio.run(run()) == [(C.INTERNAL, "Internal server error")] * 2


class _Context:
    """The one thing ``Calls.admitted`` reads of a call: its remaining time (an I/O seam)."""

    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining


@pytest.mark.parametrize(
    ("remaining", "configured", "expected"),
    [
        (5.0, None, 5.0),  # the call's deadline becomes the request's
        (5.0, 2.0, 2.0),  # clientTimeoutInMills is earlier: it stays
        (5.0, 9.0, 5.0),  # the call's is earlier: it wins
        (None, 2.0, 2.0),  # no gRPC deadline: as configured
        (None, None, None),
        (-1.0, None, 0.0),  # already past: due at once (the queue answers 504, never runs it)
    ],
)
def test_the_grpc_deadline_becomes_the_queued_requests_deadline(
    remaining, configured, expected
) -> None:
    from torchbay.server.plane.exchange import with_deadline
    from torchbay.server.serving.queue import Pending, clock

    now = clock()
    own = None if configured is None else now + configured
    item = Pending(payload=None, future=None, arrival=now, deadline=own)  # type: ignore[arg-type]
    with_deadline(item, _Context(remaining).time_remaining())  # what Calls.infer passes
    if expected is None:
        assert item.deadline is None
    else:
        assert item.deadline is not None
        assert abs((item.deadline - now) - expected) < 1.0  # seconds of slack for a slow machine


def test_one_grpc_server_holds_all_services_when_both_name_one_address() -> None:
    import asyncio

    from torchbay.server.grpc.server import GrpcListeners

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # free again (a tiny race with other processes, no fixed number)

    async def run() -> tuple[dict[str, int], int]:
        listeners = GrpcListeners(ServerConfig(grpc_inference_port=port, grpc_management_port=port))
        listeners.bind()
        try:
            return dict(listeners.ports), len({id(s) for s in listeners.servers.values()})
        finally:
            await listeners.stop(0)

    ports, servers = asyncio.run(run())
    assert ports == {"inference": port, "management": port} and servers == 1


def test_enable_grpc_ssl_checks_the_tls_files_before_start(tmp_path) -> None:
    from torchbay.server.http.listeners import check_tls

    config = ServerConfig(enable_grpc_ssl=True, private_key_file=tmp_path / "key.pem",
                          certificate_file=tmp_path / "cert.pem")  # fmt: skip
    with pytest.raises(errors.TorchbayError, match=r"cannot read TLS file .*cert\.pem"):
        check_tls(config)


@pytest.mark.slow
def test_a_long_non_ascii_status_message_still_reaches_the_client(live_server) -> None:
    """The details echo a client's model name (or carry a handler's message): their sent form
    (percent-encoded UTF-8) is bounded too, so the client gets NOT_FOUND, not grpc's
    RESOURCE_EXHAUSTED "Stream removed" for trailers past its 8 KiB (3000 x "€" was 27 KiB)."""
    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import InferenceServerException

    server = live_server(models=probe_models())
    client = triton_grpc.InferenceServerClient(
        f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    )
    try:
        for name in ("€" * 3000, "\x01" * 5000, "a" * 5000):
            with pytest.raises(InferenceServerException) as caught:
                client.get_model_metadata(name)
            assert caught.value.status() == "StatusCode.NOT_FOUND", caught.value
            assert "Request for unknown model" in caught.value.message()
        assert client.is_model_ready("probe")  # the server serves on
    finally:
        client.close()
