"""What a request to a sequence model says of its sequence, for every protocol.

TorchServe's API (REST and gRPC ``predict``): the headers ``ts_request_sequence_id``,
``ts_request_sequence_start`` and ``ts_request_sequence_end`` (gRPC: the ``sequence_id`` field
and ``input`` entries of those names, which its adapter passes as headers). A request without an
id starts a new sequence whose id the server makes (``ts-seq-<uuid>``, as TorchServe), and an
unknown id opens one (TorchServe's job groups). The Open Inference Protocol (REST and gRPC
``v2``): Triton's parameters ``sequence_id`` (a uint64 other than 0, or a non-empty string),
``sequence_start`` and ``sequence_end`` (booleans); a sequence model refuses a request without
an id, and an unknown id needs ``sequence_start``, as Triton does.

Either way the request then carries TorchServe's three headers in their one form (the id; start
and end as ``true`` only when set), which is what the worker's handler reads
(``context.get_sequence_id``, ``get_request_header``) and what the scheduler
(serving/sequences.py) is told through a :class:`SequenceRef`. The three names are TorchServe's
``ts_header_key_sequence_id`` / ``_start`` / ``_end`` keys (``names``, lower-case; their
defaults above): a renamed header is read, and sent on, under its new name, as TorchServe does;
a client's header under another name is none of the sequence's. Torch-free.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from torchbay.server.config.settings import SEQUENCE_HEADERS
from torchbay.server.errors import BadRequest
from torchbay.server.plane import json_members, oip_body
from torchbay.server.plane.schedule import json_header
from torchbay.server.serving import protocol as p
from torchbay.server.serving.sequences import SequenceRef

ID, START, END = SEQUENCE_HEADERS
MAX_ID_CHARS = 256  # a sequence id longer than this is a mistake, not an id
MAX_UINT64 = (1 << 64) - 1


def sequence_of(
    wire: p.WireRequest,
    limit: int = oip_body.DEFAULT_LIMIT,
    names: tuple[str, str, str] = SEQUENCE_HEADERS,
    batched: Callable[[], bool] = lambda: False,
    model: str = "",
) -> tuple[p.WireRequest, SequenceRef]:
    """``wire`` with TorchServe's sequence headers in their one form, and its ``SequenceRef``.
    Raises BadRequest (400) naming the field for an id or flag that is not one. ``limit``: the
    most bytes a compressed OIP body may inflate to (413 past it; ``oip_body.py``); ``names``:
    the headers' names (id, start, end; lower-case); ``batched``: whether the model's inputs
    have a batch dimension (its configuration's ``max_batch_size`` > 0), asked only of an OIP
    request whose first input's first dimension is over 1 (such a request of a batching
    ``model`` is refused 400, as Triton's sequence batcher refuses it)."""
    if wire.protocol == "v2":
        ref = _oip_ref(wire, limit, batched, model)
    else:
        ref = _torchserve_ref(wire, names)
    return _with_headers(wire, ref, names), ref


def _headers(wire: p.WireRequest) -> dict[str, str]:
    return p.parse_headers(wire.raw_headers) if wire.raw_headers else wire.headers


def _torchserve_ref(wire: p.WireRequest, names: tuple[str, str, str]) -> SequenceRef:
    headers = _headers(wire)
    id_name, start_name, end_name = names
    given = headers.get(id_name, "").strip()
    start, end = _flag(headers.get(start_name)), _flag(headers.get(end_name))
    if not given:
        return SequenceRef(f"ts-seq-{uuid.uuid4()}", start=True, end=end, implicit=True)
    return SequenceRef(_checked_text(given, id_name), start=start, end=end, implicit=True)


def _flag(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"


def _checked_text(value: str, field: str) -> str:
    """``value`` as a sequence id: printable, at most ``MAX_ID_CHARS``, and Latin-1 text, since
    it travels to the worker as a header line (latin-1, as HTTP/1.1's): another character
    would turn to "?" there (two ids, one state) or, from gRPC, fail to be sent at all."""
    if len(value) > MAX_ID_CHARS or not value.isprintable():
        raise BadRequest(f"{field} must be a printable string of at most {MAX_ID_CHARS} characters")
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise BadRequest(f"{field} must be Latin-1 text (it is sent on as a header)") from None
    return value


def _oip_ref(
    wire: p.WireRequest, limit: int, batched: Callable[[], bool], model: str
) -> SequenceRef:
    head = _oip_head(wire, limit)
    params = _oip_parameters(head)
    if "sequence_id" not in params:
        raise BadRequest(
            "This model is a sequence model: the request must set the parameter sequence_id "
            "(a uint64 other than 0, or a non-empty string)"
        )
    value = _typed_id(params["sequence_id"])
    if isinstance(value, int) and value == 0:
        raise BadRequest("Parameter sequence_id must be a uint64 other than 0")
    if isinstance(value, str):
        if not value:
            raise BadRequest("Parameter sequence_id must not be an empty string")
        value = _checked_text(value, "Parameter sequence_id")
    ref = SequenceRef(
        value, start=_bool_param(params, "sequence_start"), end=_bool_param(params, "sequence_end")
    )
    if _first_dim(head) > 1 and batched():  # Triton's sequence batcher's refusal, in its words
        raise BadRequest(
            f"inference request to model '{model}' must specify batch-size 1 due to "
            "requirements of sequence batcher"
        )
    return ref


def _first_dim(head: bytes) -> int:
    """The first dimension of the request's first input (its batch size when the model
    batches); 0 when it has none (the worker's 400 for a malformed input)."""
    dim = json_members.at_path(head, ("inputs", 0, "shape", 0))  # the tensors are not read
    return dim if type(dim) is int else 0


def _typed_id(value: Any) -> int | str:
    """``value`` when it is a uint64 or a string (Triton's two kinds of id), else a 400."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadRequest("Parameter sequence_id must be a uint64 or a string")
    if isinstance(value, int) and not 0 <= value <= MAX_UINT64:
        raise BadRequest("Parameter sequence_id must be a uint64 (0 to 2^64-1)")
    return value


def check_ignored(wire: p.WireRequest, limit: int = oip_body.DEFAULT_LIMIT) -> None:
    """An OIP request to a model without sequences: its ``sequence_id``, ``sequence_start`` and
    ``sequence_end`` are ignored, but one of the wrong type is a 400 naming it, as Triton's
    frontends refuse it for every model (an id that is no uint64 nor string, a flag that is no
    boolean). A byte search when the request names none; a body that is not JSON is left to
    the worker's 400."""
    head = json_header(wire, limit)
    if b'"sequence_' not in head:
        return
    try:
        params = json_members.at_path(head, ("parameters",))  # the tensors are not read
    except (ValueError, RecursionError):
        return
    if not isinstance(params, dict):
        return
    if "sequence_id" in params:
        _typed_id(params["sequence_id"])
    _bool_param(params, "sequence_start")
    _bool_param(params, "sequence_end")


def _bool_param(params: dict[str, Any], name: str) -> bool:
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"Parameter {name} must be a boolean")
    return value


def _oip_head(wire: p.WireRequest, limit: int) -> bytes:
    """The JSON part of an OIP body (all of it, or the first ``Inference-Header-Content-Length``
    bytes of a binary-tensor body), inflated first when it came compressed."""
    headers = _headers(wire)
    body = oip_body.inflated(wire, limit)
    length = headers.get("inference-header-content-length")
    if length is not None:
        try:
            body = body[: int(length)]
        except ValueError:
            raise BadRequest("Inference-Header-Content-Length must be an integer") from None
    return body


def _oip_parameters(head: bytes) -> dict[str, Any]:
    """The request-level ``parameters`` of an OIP body's JSON part ({} when it has none, or is
    no JSON object: the worker answers the rest), read without its tensors."""
    try:
        params = json_members.at_path(head, ("parameters",)) if head else None
    except (ValueError, RecursionError):
        raise BadRequest("The request body is not valid JSON") from None
    if params is None or params is json_members.MISSING:
        return {}
    if not isinstance(params, dict):
        raise BadRequest("The request's parameters must be a JSON object")
    return params


def _with_headers(
    wire: p.WireRequest, ref: SequenceRef, names: tuple[str, str, str]
) -> p.WireRequest:
    """``wire`` carrying exactly the sequence headers that ``ref`` says, under ``names`` (a
    client's own lines of those names are replaced)."""
    id_name, start_name, end_name = names
    ours = {id_name: str(ref.id)}
    if ref.start:
        ours[start_name] = "true"
    if ref.end:
        ours[end_name] = "true"
    encoded = {name.encode() for name in names}
    if wire.raw_headers:
        lines = [
            line
            for line in wire.raw_headers.split(b"\r\n")
            if line.partition(b":")[0].strip().lower() not in encoded
        ]
        lines += [f"{k}: {v}".encode("latin-1", "replace") for k, v in ours.items()]
        return dataclasses.replace(wire, raw_headers=b"\r\n".join(lines))
    headers = {k: v for k, v in wire.headers.items() if k.lower() not in names}
    return dataclasses.replace(wire, headers={**headers, **ours})


def without_controls(sig: Any, handler_config: Mapping[str, Any] | None) -> Any:
    """A model's signature (an archiver ``Signature``, or None) without the control inputs a
    model-config.yaml declares in Triton's ``sequence_batching``: the worker fills them
    (handlers/runtime/controls.py) and refuses a request that sends one, so the model's
    metadata and configuration leave them out, as Triton's do."""
    batching = (handler_config or {}).get("sequence_batching")
    controls = batching.get("control_input") if isinstance(batching, Mapping) else None
    if sig is None or not isinstance(controls, list):
        return sig
    filled = {c.get("name") for c in controls if isinstance(c, Mapping)}
    return sig.model_copy(update={"inputs": [t for t in sig.inputs if t.name not in filled]})
