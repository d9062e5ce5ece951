"""TorchServe's ``Context`` and ``RequestProcessor`` (ts/context.py), torch-free.

A ``Context`` is built once per loaded model. The Service resets the per-batch state
(``request_ids``, ``request_processor``, ``stage_timings``) before every batch, so response
statuses and headers a handler sets apply to the current batch only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# TorchServe's sequence headers (ts/context.py), renamed by the same environment variables. The
# server sets them on every request of a sequence model (serving/sequences.py): the id always,
# start and end ("true") only on a sequence's first and last request; a worker the server starts
# has its context's names set to the server's (its ts_header_key_sequence_* keys), which are the
# names its requests carry them under.
SEQUENCE_ID = os.getenv("TS_REQUEST_SEQUENCE_ID", "ts_request_sequence_id")
SEQUENCE_START = os.getenv("TS_REQUEST_SEQUENCE_START", "ts_request_sequence_start")
SEQUENCE_END = os.getenv("TS_REQUEST_SEQUENCE_END", "ts_request_sequence_end")


class RequestHeaders(dict[str, Any]):
    """One request's headers by lower-case name (as ASGI and HTTP/2 carry them), looked up in
    any case: TorchServe keeps the client's spelling, so handlers written for it read
    ``props.get("X-Amzn-SageMaker-Custom-Attributes")`` or ``props["Content-Type"]``. As in
    TorchServe, each input parameter (row key) is there too, as ``{"content-type": ...}``."""

    def __init__(self, headers: Mapping[str, Any] | None = None) -> None:
        super().__init__((_lower(k), v) for k, v in (headers or {}).items())

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(_lower(key))

    def __contains__(self, key: object) -> bool:
        return super().__contains__(_lower(key))

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(_lower(key), default)


def _lower(key: Any) -> Any:
    return key.lower() if isinstance(key, str) else key


class RequestProcessor:
    """Request headers in, response status and headers out, for one request of a batch."""

    def __init__(self, request_header: Mapping[str, Any]) -> None:
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, str] = {}
        self._request_header = RequestHeaders(request_header)

    def get_request_property(self, key: str) -> str | None:
        return self._request_header.get(key)

    def get_request_properties(self) -> dict[str, str]:
        return self._request_header

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        # A bool is kept as given so the Service rejects it (int(True) would be a valid-looking 1).
        self._status_code = code if isinstance(code, bool) else int(code)
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, str]:
        return self._response_header

    def get_response_header(self, key: str) -> str | None:
        return self._response_header.get(key)


class Context:
    """Model-level facts fixed at load time plus per-batch request/response state."""

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: dict[str, Any],
        batch_size: int,
        gpu: int | None,
        mms_version: str,
        limit_max_image_pixels: bool = True,
        metrics: Any = None,
        model_yaml_config: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.manifest = manifest
        self._system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": gpu,
            "batch_size": batch_size,
            "server_name": "MMS",
            "server_version": mms_version,
            "limit_max_image_pixels": limit_max_image_pixels,
        }
        self.request_ids: dict[int, str] | None = None
        self._request_processor: list[RequestProcessor] | None = None
        self.metrics = metrics
        self.model_yaml_config: dict[str, Any] = model_yaml_config or {}
        # Stage durations (ms) recorded by BaseHandler.handle for the current batch.
        self.stage_timings: dict[str, float] = {}
        self.cl_socket = None
        # The current handler run's streaming.RunStream (send_intermediate_predict_response).
        self.stream: Any = None
        # A continuous-batching handler's per-request stopping criteria, set by the handler after
        # each call (TorchServe's; see runtime/continuous.py).
        self.stopping_criteria: Any = None
        self.header_key_sequence_id = SEQUENCE_ID
        self.header_key_sequence_start = SEQUENCE_START
        self.header_key_sequence_end = SEQUENCE_END

    @property
    def system_properties(self) -> dict[str, Any]:
        return self._system_properties

    @property
    def request_processor(self) -> list[RequestProcessor] | None:
        return self._request_processor

    @request_processor.setter
    def request_processor(self, request_processor: list[RequestProcessor] | None) -> None:
        self._request_processor = request_processor

    def reset_batch(self, request_ids: list[str], headers: list[dict[str, Any]]) -> None:
        """Start a new batch: fresh ids, request headers and response state (Service calls it)."""
        self.request_ids = dict(enumerate(request_ids))
        self._request_processor = [RequestProcessor(h) for h in headers]
        key = self.header_key_sequence_id
        for processor in self._request_processor:  # a sequence's id goes back in its response
            sequence_id = processor.get_request_property(key)  # (SageMaker's sticky routing
            if isinstance(sequence_id, str):  # reads it); a handler may overwrite it (not a
                # form field of that name: its {"content-type": ...} entry, see RequestHeaders)
                processor.add_response_property(key, sequence_id)
        self.stage_timings = {}
        if hasattr(self.metrics, "request_ids"):
            self.metrics.request_ids = self.request_ids

    def is_cancelled(self, idx: int = 0) -> bool:
        """The client of request ``idx`` went away (torchbay's own: a streaming handler may stop
        early; ``send_intermediate_predict_response`` skips such requests anyway)."""
        stream = self.stream
        return bool(stream is not None and stream.cancelled(idx))

    def get_request_id(self, idx: int = 0) -> str | None:
        if self.request_ids is None:
            return None
        return self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self._processor(idx).get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        return self._processor(idx).get_request_properties()

    def get_sequence_id(self, idx: int = 0) -> str | None:
        return self._processor(idx).get_request_property(self.header_key_sequence_id)

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.get_response_headers(idx).get("content-type")

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        processor = self._processor(idx)
        return processor.get_response_status_code(), processor.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        """Set the status of request ``idx`` (index into the list given to ``handle``)."""
        if self._request_processor is not None and idx < len(self._request_processor):
            self._request_processor[idx].report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for processor in self._request_processor or []:
            processor.report_status(code, reason_phrase=phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self._processor(idx).get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self._processor(idx).add_response_property(key, value)

    def _processor(self, idx: int) -> RequestProcessor:
        if self._request_processor is None:
            raise IndexError("no batch is being processed")
        return self._request_processor[idx]
