"""Request decoding into TorchServe's input rows, and the Open Inference Protocol (v2) envelope.

Torch-free. ``decode_request`` turns one request into TorchServe's row dict; ``wrap_result`` wraps
the result of a handler that does not speak v2 natively (like TorchServe's kservev2 envelope) as
one OIP output (the OIP request and response codec: ``oip``, ``oip_binary``, ``oip_response``).

JSON nesting is capped at ``MAX_JSON_DEPTH`` (128) levels, checked by a linear scan *before*
``json.loads`` recurses: a tensor needs one level per dimension (real ones have fewer than 10), and
128 stays far below Python's recursion limit (1000), so nothing downstream that walks the decoded
value (flatten, torch.as_tensor, json.dumps of an echo) can overflow the stack. Deeper is 400.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
from python_multipart.multipart import MultipartParser, parse_options_header

from ..errors import BadInput
from .responses import dumps

_V2_NAMES = "BOOL UINT8 UINT16 UINT32 UINT64 INT8 INT16 INT32 INT64 FP16 FP32 FP64 BF16 BYTES"
V2_DATATYPES = frozenset(_V2_NAMES.split(" "))


def split_content_type(content_type: str) -> tuple[str, dict[str, str]]:
    """``("application/json", {"charset": "utf-8"})`` from a Content-Type value."""
    mime, params = parse_options_header(content_type or "")
    return mime.decode("latin-1").lower(), {
        k.decode("latin-1").lower(): v.decode("latin-1") for k, v in params.items()
    }


def decode_text(body: bytes, charset: str = "utf-8") -> str:
    try:
        return body.decode(charset or "utf-8")
    except (UnicodeDecodeError, LookupError) as exc:
        raise BadInput(f"body is not valid {charset} text") from exc


MAX_JSON_DEPTH = 128
_BRACKETS_ONLY = bytes(c for c in range(256) if c not in b"[]{}")
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[list(b"[{")] = 1
_DELTA[list(b"]}")] = -1
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')


def json_depth(body: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """The bracket nesting depth of a JSON text (0 when it cannot exceed ``limit``).

    Linear and recursion-free, all in C loops: drop escape pairs (``\\x``), then string literals,
    then everything but brackets, and take the maximum of the running sum. Text after an
    unterminated string is ignored (``json.loads`` stops there with a ValueError); a backslash
    outside a string is likewise a point json.loads never parses past.
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return 0  # cannot be deeper than the number of openers
    if b'"' in body:
        body = _STRING.sub(b"", _ESCAPE.sub(b"", body))
        quote = body.find(b'"')
        if quote >= 0:
            body = body[:quote]
    brackets = np.frombuffer(body.translate(None, _BRACKETS_ONLY), dtype=np.uint8)
    if not brackets.size:
        return 0
    return int(np.cumsum(_DELTA[brackets], dtype=np.int64).max())


def decode_json(body: bytes) -> Any:
    """``json.loads`` with the nesting cap; raises BadInput for anything undecodable."""
    if json_depth(body) > MAX_JSON_DEPTH:
        raise BadInput(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(body)
    except RecursionError as exc:  # defence in depth: the scan above should have caught it
        raise BadInput(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from exc
    except (ValueError, UnicodeError) as exc:
        raise BadInput(f"body is not valid JSON: {exc}") from exc


# The Content-Type parameter with which server/http/kserve_v1.py sends a KServe v1 instance of
# strings as a form: the handler's row is the instance, its values str as in the JSON (a client's
# form fields are bytearrays, as TorchServe 0.12 hands them). With the value ``generate``
# (server/http/streaming.py) the body is the generate extension's: one JSON object, else 400.
INSTANCE_PARAM = "torchbay-row"
GENERATE_ROW = "generate"
GENERATE_MESSAGE = "The generate request body must be a JSON object"


class Undecoded(bytearray):
    """A body or file part that its content type says is JSON or text but that does not decode:
    handed to the handler raw, as TorchServe 0.12 hands it (a bytearray); ``reason`` says why,
    so that torchbay's own handlers answer 400 (``BaseHandler.map_items``)."""

    __slots__ = ("reason",)

    def __init__(self, data: bytes, reason: str) -> None:
        super().__init__(data)
        self.reason = reason


def decode_value(data: bytes, mime: str, charset: str | None, decode: bool = True) -> Any:
    """One input as TorchServe 0.12 decodes it by its content type: JSON parsed, text as str
    (in its charset; TorchServe's is always UTF-8), anything else, or either when ``decode`` is
    false, a bytearray; JSON or text that does not decode, an :class:`Undecoded` bytearray."""
    try:
        if decode and (mime == "application/json" or mime.endswith("+json")):
            return decode_json(data)
        if decode and mime.startswith("text/"):
            return decode_text(data, charset or "utf-8")
    except BadInput as exc:
        return Undecoded(data, exc.message)
    return data if type(data) is bytearray else bytearray(data)  # a file part's: no second copy


def mime_type(content_type: str) -> str:
    """A Content-Type value without its parameters, as given (Netty's ``HttpUtil.getMimeType``,
    the content type TorchServe 0.12 gives a body or file part)."""
    return (content_type or "").split(";", 1)[0].strip()


def decode_body(
    body: bytes, content_type: str, decode: bool = True, types: dict[str, str] | None = None
) -> dict[str, Any]:
    """The row entries a body yields: ``{"body": value}`` or one entry per form field. With
    ``decode`` false (TorchServe's ``decode_input_request=false``), JSON and text stay raw.
    ``types`` gets each entry's content type as TorchServe 0.12 gives it the handler (among the
    request's headers): the body's and a file part's without parameters, a field's empty."""
    types = {} if types is None else types
    mime, params = split_content_type(content_type)
    if mime == "multipart/form-data":
        boundary = params.get("boundary")
        if not boundary:
            raise BadInput("multipart/form-data body without a boundary")
        return parse_multipart(body, boundary, decode, types) if body else {}
    if mime == "application/x-www-form-urlencoded":
        text = bytes(body).decode("latin-1")  # each byte as itself, percent-decoded the same
        fields = parse_qsl(text, keep_blank_values=True, encoding="latin-1")
        types.update((_utf8(k), "") for k, _ in fields)
        if params.get(INSTANCE_PARAM) == "instance":  # a KServe v1 instance: its strings as sent
            return {_utf8(k): _utf8(v) for k, v in fields}
        return {_utf8(k): bytearray(v.encode("latin-1")) for k, v in fields}
    types["body"] = mime_type(content_type)
    if params.get(INSTANCE_PARAM) == GENERATE_ROW:
        return {"body": generate_object(body, decode)}
    return {"body": decode_value(body, mime, params.get("charset"), decode)}


def generate_object(body: bytes, decode: bool = True) -> Any:
    """The generate extension's body: one JSON object (raw when ``decode`` is false), else
    BadInput (400), as Triton refuses it; parsed here, in the worker, not on the frontend's
    event loop (a body of ``max_request_size`` bytes takes seconds to parse)."""
    try:
        value = decode_json(body)
    except BadInput:
        value = None
    if not isinstance(value, dict):
        raise BadInput(GENERATE_MESSAGE)
    return value if decode else bytearray(body)


def _utf8(latin: str) -> str:
    return latin.encode("latin-1").decode("utf-8", "replace")


def decode_request(
    body: bytes,
    content_type: str,
    query: str,
    decode: bool = True,
    types: dict[str, str] | None = None,
) -> dict[str, Any]:
    """TorchServe's input row for one request (tests/data/torchserve/handler_inputs): a body or
    a form's fields as TorchServe 0.12 gives them (an empty body too: an empty form is no key);
    query parameters are added as ``str`` for the keys the body did not set, the last of a
    repeated one, as on TorchServe. ``types``: see decode_body (a query parameter's is empty).
    Raises BadInput for a malformed multipart body."""
    types = {} if types is None else types
    row = decode_body(body, content_type, decode, types)
    for key, value in dict(parse_qsl(query or "", keep_blank_values=True)).items():
        if key not in row:
            row[key], types[key] = value, ""
    return row


def parse_multipart(
    body: bytes, boundary: str, decode: bool = True, types: dict[str, str] | None = None
) -> dict[str, Any]:
    """A form's fields as TorchServe 0.12 gives them: a field as a bytearray, a file part (one
    with a filename) by its Content-Type (default application/octet-stream), see decode_value;
    ``types`` gets each one's content type (see decode_body)."""
    types = {} if types is None else types
    fields: dict[str, Any] = {}
    state: dict[str, Any] = {}

    def on_part_begin() -> None:
        state.update(headers={}, field=b"", value=b"", data=bytearray())

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["value"] += data[start:end]

    def on_header_end() -> None:
        state["headers"][state["field"].decode("latin-1").lower()] = state["value"]
        state["field"], state["value"] = b"", b""

    def on_part_data(data: bytes, start: int, end: int) -> None:
        state["data"] += data[start:end]

    def on_part_end() -> None:
        _, opts = parse_options_header(state["headers"].get("content-disposition", b""))
        name = opts.get(b"name", b"").decode("utf-8", "replace")
        data = state["data"]
        if b"filename" in opts:
            ctype = state["headers"].get("content-type", b"").decode("latin-1")
            mime, params = split_content_type(ctype or "application/octet-stream")
            fields[name] = decode_value(data, mime, params.get("charset"), decode)
            types[name] = mime_type(ctype) or "application/octet-stream"
        else:
            fields[name], types[name] = data, ""

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
            "on_end": lambda: state.update(ended=True),
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except BadInput:
        raise
    except Exception as exc:  # python-multipart raises its own error types
        raise BadInput(f"malformed multipart body: {exc}") from exc
    if not state.get("ended"):
        raise BadInput("malformed multipart body: no closing boundary")
    return fields


# -- Open Inference Protocol (KServe v2) -------------------------------------------------------


def flatten(data: Any) -> list[Any]:
    """Row-major flattening of nested JSON lists (iterative: no recursion however deep)."""
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def output_names(request: dict[str, Any]) -> list[str]:
    return [str(o["name"]) for o in request.get("outputs") or []]


_RAW = (bytes, bytearray, memoryview)


def wrap_result(
    result: Any, request: dict[str, Any], default: str = "output0"
) -> list[dict[str, Any]]:
    """A non-v2 handler's result for one request as a one-tensor OIP output list, named as the
    request asks, else ``default`` (the signature's first output, or output0)."""
    names = output_names(request)
    name = names[0] if names else default
    if not isinstance(result, (list, str, *_RAW)) and callable(getattr(result, "tolist", None)):
        result = result.tolist()  # a tensor or numpy array: its values (TorchServe's kservev2)
    if isinstance(result, _RAW):  # as /predictions takes them
        result = bytes(result).decode("utf-8", "replace")
    if isinstance(result, (dict, str)) or (isinstance(result, list) and not _is_numeric(result)):
        data = [result if isinstance(result, str) else dumps(result).decode()]
        return [{"name": name, "shape": [1], "datatype": "BYTES", "data": data}]
    flat = flatten(result)
    return [
        {
            "name": name,
            "shape": nested_shape(result),
            "datatype": infer_datatype(flat),
            "data": flat,
        }
    ]


def _is_numeric(value: Any) -> bool:
    return all(isinstance(v, (int, float, bool)) for v in flatten(value))


def nested_shape(value: Any) -> list[int]:
    shape: list[int] = []
    while isinstance(value, list):
        shape.append(len(value))
        value = value[0] if value else None
    return shape


def infer_datatype(flat: list[Any]) -> str:
    if flat and all(isinstance(v, bool) for v in flat):
        return "BOOL"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return "INT64"
    return "FP32"
