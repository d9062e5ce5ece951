"""The server's exception tree. Each class carries its HTTP status and a stable ``code`` string.

    TorchbayError (500 internal_error)
    ├── ConfigError (500 config_error)           bad configuration, raised at start
    ├── BadRequest (400 bad_request)
    │   ├── InvalidModelVersion (400 invalid_model_version)  (unregister an unknown version)
│   ├── AlreadyExists (400 already_exists)    a shared-memory region's name is taken (Triton's
│   │                                         ALREADY_EXISTS: HTTP 400, gRPC ALREADY_EXISTS)
    │   └── ClientDisconnected (499 client_disconnected)     the client left (or was timed out)
    │                                                        before its whole body arrived
    ├── Unauthorized (401 unauthorized)
    ├── Forbidden (403 forbidden)
    │   └── DefaultVersionInUse (403 default_version_in_use)
    ├── NotFound (404 not_found)
    │   ├── ModelNotFound (404 model_not_found)
    │   └── ModelVersionNotFound (404 model_version_not_found)
    ├── MethodNotAllowed (405 method_not_allowed)
    ├── Conflict (409 conflict)                   (register a name/version that exists)
    ├── PayloadTooLarge (413 payload_too_large)
    ├── InsufficientStorage (507 insufficient_storage)  no room to load a model (SageMaker's
    │                                                   "unload some and retry")
    ├── HandlerFailed (500 handler_error)         the handler raised or broke its contract
    ├── Unsupported (501 unsupported)             a feature this server was started without
    │                                             (Triton's UNSUPPORTED: HTTP 501, gRPC
    │                                             UNIMPLEMENTED), e.g. client shared memory
    ├── StreamNotSupported (501 stream_not_supported)  a streaming handler's answer on an
    │                                             endpoint of one response (OIP infer)
    ├── ServiceUnavailable (503 service_unavailable)
    │   ├── QueueFull (503 queue_full)            with Retry-After
    │   ├── Overloaded (503 overloaded)           with Retry-After: past max_queue_delay_ms
    │   ├── QueueTimeout (503 queue_timeout)      a priority level's timeout passed while it was
    │   │                                         queued (Triton's REJECT: UNAVAILABLE)
    │   ├── NoWorker (503 no_worker)
    │   ├── WorkerDied (503 worker_died)
    │   └── ShuttingDown (503 shutting_down)
    └── RequestTimeout (504 timeout)

Foreign exceptions are mapped at the boundary; nothing here classifies errors by message text.
This module imports nothing of ours.
"""

from __future__ import annotations


class TorchbayError(Exception):
    status: int = 500
    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        oip_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        # Triton's wording of the same error, for the Open Inference Protocol's answers (REST
        # and gRPC): the scripts around Triton's clients match on it. None: ``message``.
        self.oip_message = oip_message

    @property
    def oip_text(self) -> str:
        """The message an OIP answer carries: Triton's wording where it has one."""
        return self.oip_message or self.message

    @property
    def type(self) -> str:
        """The TorchServe-style ``type`` field of the error body (the exception class name)."""
        return type(self).__name__

    def to_json(self) -> dict[str, object]:
        return {"code": self.status, "type": self.type, "message": self.message}


class ConfigError(TorchbayError):
    code = "config_error"


class BadRequest(TorchbayError):
    status, code = 400, "bad_request"


class InvalidModelVersion(BadRequest):
    code = "invalid_model_version"


class AlreadyExists(BadRequest):
    code = "already_exists"


class ClientDisconnected(BadRequest):
    """Recorded as nginx's 499: the request never ran and nobody reads the answer (the body
    timeout's 408 was already sent by the HTTP protocol, server.http.limits)."""

    status, code = 499, "client_disconnected"


class Unauthorized(TorchbayError):
    status, code = 401, "unauthorized"


class Forbidden(TorchbayError):
    status, code = 403, "forbidden"


class DefaultVersionInUse(Forbidden):
    code = "default_version_in_use"


class NotFound(TorchbayError):
    status, code = 404, "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class ModelVersionNotFound(NotFound):
    code = "model_version_not_found"

    @staticmethod
    def triton_text(name: str, version: str) -> str:
        """Triton's words for a version it lacks: its versions are integers, so a version string
        that is not one fails to parse there (Triton's clients look for that text)."""
        if version.isdigit():
            return f"Request for unknown model: '{name}' version {version} is not found"
        return (
            f"failed to get model version from specified version string '{version}': "
            f"model '{name}' has no such version"
        )


class MethodNotAllowed(TorchbayError):
    status, code = 405, "method_not_allowed"


class Conflict(TorchbayError):
    status, code = 409, "conflict"


class UnsupportedMediaType(BadRequest):
    """A body in an encoding the server does not read (``Content-Encoding: br``)."""

    status, code = 415, "unsupported_media_type"


class PayloadTooLarge(TorchbayError):
    status, code = 413, "payload_too_large"


class InsufficientStorage(TorchbayError):
    """A model that cannot be loaded for want of room: its load ran out of memory, or the
    loaded-models budget is full of models that may not be unloaded. SageMaker's multi-model
    contract reads 507 as "unload models and try again"."""

    status, code = 507, "insufficient_storage"


class HandlerFailed(TorchbayError):
    code = "handler_error"


class Unsupported(TorchbayError):
    """A feature the operator left off (client shared memory without ``allow_client_shm``):
    Triton's TRITONSERVER_ERROR_UNSUPPORTED, HTTP 501 and gRPC UNIMPLEMENTED."""

    status, code = 501, "unsupported"


class StreamNotSupported(TorchbayError):
    """A handler that streams (several answers to one request) called through an endpoint that
    answers once: Triton's refusal of a decoupled model there."""

    status, code = 501, "stream_not_supported"


class ServiceUnavailable(TorchbayError):
    status, code = 503, "service_unavailable"


class QueueFull(ServiceUnavailable):
    code = "queue_full"


class Overloaded(ServiceUnavailable):
    """A request that would wait (or waited) past its model's queue-time bound."""

    code = "overloaded"


class QueueTimeout(ServiceUnavailable):
    """A request its queue policy rejected: its timeout passed while it was queued (Triton's
    ``timeout_action: REJECT``, answered UNAVAILABLE "Request timeout expired")."""

    code = "queue_timeout"


class NoWorker(ServiceUnavailable):
    code = "no_worker"


class WorkerDied(ServiceUnavailable):
    code = "worker_died"


class ShuttingDown(ServiceUnavailable):
    code = "shutting_down"


class SlowReader(ServiceUnavailable):
    """A stream whose client reads it slower than its handler writes it, ended when the parts
    waiting to be sent would pass ``max_response_size`` (serving/streams.py)."""

    code = "slow_reader"


class RequestTimeout(TorchbayError):
    status, code = 504, "timeout"
