"""A handler's result for one request as its ``Response``: the status and headers the handler set
through the context (validated: see service.py's docstring), then the body by the result's type
and the request's protocol. The Service's half that runs after the handler returned.
"""

from __future__ import annotations

import io
import logging
import sys
from typing import Any, Protocol

from ..context import Context
from ..errors import PredictionException
from . import oip_response
from .envelopes import GENERATE_ROW, INSTANCE_PARAM, split_content_type
from .responses import (
    FRAMING_HEADERS,
    Response,
    dumps,
    error_response,
    header_problem,
    prediction_error,
    status_problem,
)

logger = logging.getLogger("torchbay.handlers.runtime.service")  # the Service's, as before


def _kserve_instance(content_type: str) -> bool:
    """A KServe v1 instance or a generate request (server/http/kserve_v1.py and streaming.py
    mark their content type): its answer goes into a JSON answer, a tensor as its values."""
    return split_content_type(content_type)[1].get(INSTANCE_PARAM) in ("instance", GENERATE_ROW)


def _saved_tensor(item: Any) -> Any:
    """A tensor result as TorchServe 0.12 answers it (otf_message_handler.create_predict_response):
    what ``torch.save`` writes, which a client reads back with ``torch.load``; anything else as
    it is. torch is in ``sys.modules`` whenever the result is a tensor: never imported here."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(item, torch.Tensor):
        return item
    buffer = io.BytesIO()
    torch.save(item, buffer)
    return buffer.getvalue()


class JobLike(Protocol):
    """One decoded request (service._Job): the request, its row and its OIP request if any."""

    request: Any
    row: Any
    v2: dict[str, Any] | None


class ResultEncoder:
    """Mixed into the Service, whose attributes it reads: the context the handler wrote the
    batch's statuses and headers to, the handler (its label ``mapping``), and the model's
    names and signature (OIP answers)."""

    context: Context
    handler: Any
    native_v2: bool
    model_name: str
    model_version: str
    signature: Any

    def _encode(self, idx: int, item: Any, job: JobLike) -> Response:
        """The response for result ``idx``; a result or header that cannot be sent is a 500."""
        rid = job.request.request_id
        try:
            status, phrase = self.context.get_response_status(idx)
            headers = self._headers(idx, status, rid)
            if headers is None:
                message = f"The handler set an invalid response status or header; request id {rid}"
                return error_response(500, "InvalidResponse", message, job.v2 is not None)
            content_type = headers.pop("content-type", None)
            return self._body(status, phrase, item, job, headers, content_type)
        except PredictionException as exc:  # e.g. an unknown requested output (400)
            return prediction_error(exc, job.v2 is not None)
        except Exception as exc:  # an unencodable result fails its own request only
            logger.error("cannot encode the result of request %s", rid, exc_info=exc)
            message = f"The handler's result cannot be encoded ({type(exc).__name__}); "
            message += f"request id {rid}"
            return error_response(500, type(exc).__name__, message, job.v2 is not None)

    def _headers(self, idx: int, status: object, rid: str) -> dict[str, str] | None:
        """The validated response headers (lower-case names), or None with the reason logged."""
        problem = status_problem(status)
        headers: dict[str, str] = {}
        for name, value in dict(self.context.get_response_headers(idx)).items():
            problem = problem or header_problem(name, value)
            if problem is None and name.lower() in FRAMING_HEADERS:
                logger.warning("request %s: dropping the handler's %s header", rid, name)
            elif problem is None:
                headers[name.lower()] = value
        if problem is not None:
            logger.error("request %s: the handler set an invalid response: %s", rid, problem)
            return None
        return headers

    def _body(
        self,
        status: int,
        phrase: str | None,
        item: Any,
        job: JobLike,
        headers: dict[str, str],
        content_type: str | None,
    ) -> Response:
        v2 = job.v2
        if status >= 400 and item is None:
            return error_response(status, "PredictionException", phrase or "", v2 is not None)
        if v2 is not None and status < 400:
            labels = getattr(self.handler, "mapping", None)
            model = (self.model_name, self.model_version, labels, self.signature)
            body, ctype, more = oip_response.reply(
                item, self.native_v2, v2, model, job.request.headers
            )
            return Response(status, body, ctype, {**headers, **more})
        if v2 is not None and isinstance(item, dict) and "message" in item:
            item = {**item, "error": item["message"]}
        if v2 is None and not _kserve_instance(job.request.content_type):
            item = _saved_tensor(item)
        if isinstance(item, (bytes, bytearray, memoryview)):
            return Response(
                status, bytes(item), content_type or "application/octet-stream", headers
            )
        if isinstance(item, str):
            return Response(
                status, item.encode(), content_type or "text/plain; charset=utf-8", headers
            )
        return Response(status, dumps(item), content_type or "application/json", headers)
