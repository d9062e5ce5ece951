"""One ``/wfpredict`` request through a workflow's DAG, as TorchServe 0.12's DagExecutor runs it.

The start node gets the request as it came (body, content type, query, headers). A node with
one parent gets that parent's output as its body (bytes, as TorchServe gives it); a node with
several parents gets one form field per parent, named by the parent node, each that parent's
output as bytes (fan-in). A node runs as soon as its last parent has answered, so branches run
side by side (fan-out). Every node request is an exchange of the data plane to the node's model
(``plane.exchange``): admission, queue, deadline, metrics and the access line are those of any
request. A node is tried ``retry-attempts`` more times after a failure (an error status, or no
answer within ``timeout-ms``); then the workflow answers 500 naming the node, in TorchServe's
words (``Error executing <node>``), and the nodes still running are cancelled. A node that
streams has its parts gathered as its output, at most the model's ``max_response_size`` bytes
(past that it failed, as a response too large).

The answer: the only leaf's output as it is; with several leaves, a JSON object of each leaf's
output (parsed as JSON) by node name. Torch-free.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from collections.abc import Mapping
from typing import Any

from torchbay.server.errors import RequestTimeout, TorchbayError
from torchbay.server.plane import DataPlane, Exchange, Gathered, WireRequest
from torchbay.server.plane.schedule import schedule_of
from torchbay.server.workflows.workflow import Workflow

log = logging.getLogger("torchbay.workflows")
_BOUNDARY = "torchbay-workflow-node"


class InternalServerException(TorchbayError):
    """A node failed after its attempts (TorchServe's type and status)."""


async def run(
    plane: DataPlane, workflow: Workflow, scope: Mapping[str, Any], request: WireRequest
) -> bytes:
    """The workflow's answer to ``request``; raises InternalServerException naming a node, or
    BadRequest for schedule headers that are not the plane's (every node would refuse them)."""
    schedule_of(request)  # x-torchbay-priority / -timeout-us: a 400 before any node runs
    spec = workflow.spec
    outputs: dict[str, bytes] = {}
    waiting = {name: len(spec.parents[name]) for name in spec.nodes}
    running: dict[asyncio.Future[bytes], str] = {}

    def launch(node: str, wire: WireRequest) -> None:
        task = asyncio.ensure_future(_invoke(plane, workflow, node, dict(scope), wire))
        running[task] = node

    launch(spec.start, request)
    try:
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                node = running.pop(task)
                outputs[node] = task.result()  # raises: the first failing node answers
                for kid in spec.children[node]:
                    waiting[kid] -= 1
                    if waiting[kid] == 0:
                        launch(kid, _node_input(request, spec.parents[kid], outputs))
    finally:
        for task in running:
            task.cancel()
    return _answer({leaf: outputs[leaf] for leaf in spec.leaves()})


async def _invoke(
    plane: DataPlane, workflow: Workflow, node: str, scope: dict[str, Any], wire: WireRequest
) -> bytes:
    settings = workflow.spec.nodes[node].settings
    attempts = max(settings["retry-attempts"], 0) + 1
    for attempt in range(attempts):
        try:
            return await _once(plane, workflow.model_of(node), scope, wire, settings["timeout-ms"])
        except TorchbayError as exc:
            log.warning(
                "workflow %s: node %s failed (attempt %d of %d): %s",
                workflow.name,
                node,
                attempt + 1,
                attempts,
                exc,
            )
    raise InternalServerException(f"Error executing {node}")


async def _once(
    plane: DataPlane, model: str, scope: dict[str, Any], wire: WireRequest, timeout_ms: int
) -> bytes:
    """One request to a node's model through the plane; its whole body, or raises (NodeTimedOut
    past ``timeout_ms``, when above 0: the request is cancelled and recorded as a 504)."""
    wire = WireRequest(
        request_id=uuid.uuid4().hex,
        body=wire.body,
        content_type=wire.content_type,
        query=wire.query,
        raw_headers=wire.raw_headers,
    )
    with plane.exchange(scope, model, None) as ex:
        size = Gathered(ex.resolve().settings.max_response_size)  # a streaming node's parts
        timeout = timeout_ms / 1000 if timeout_ms > 0 else None
        try:
            status, body = await asyncio.wait_for(_gathered(ex, wire, size), timeout)
        except asyncio.TimeoutError:  # (not the builtin one on 3.10)
            raise NodeTimedOut(f"no answer within its timeout-ms ({timeout_ms})") from None
        if status >= 400:
            raise NodeFailed(status, body)
        return body


async def _gathered(ex: Exchange, wire: WireRequest, size: Gathered) -> tuple[int, bytes]:
    """The node's status and its whole output (a streaming node's parts, bounded by ``size``)."""
    parts: list[bytes] = []
    status = 500
    async for response in ex.responses(wire):
        status = response.status
        parts.append(size.add(response.body))
    return status, b"".join(parts)


class NodeTimedOut(RequestTimeout):
    """A node gave no answer within its ``timeout-ms``: its request is recorded as a 504 (the
    metrics and access line of the node's model), not as a client that left (499)."""


class NodeFailed(TorchbayError):
    """A node's model answered an error (its status and body are logged, never forwarded)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"status {status}: {body[:200]!r}")
        self.status = status


# The headers that describe the workflow request's own body, not a node's output: a child never
# gets them (its worker would decode its parent's output by them).
_BODY_HEADERS = tuple(
    name + b":" for name in (b"content-type", b"content-length", b"content-encoding")
)


def _node_input(request: WireRequest, parents: list[str], outputs: dict[str, bytes]) -> WireRequest:
    """A child's request: its parent's output, or a form of every parent's output by name, with
    the workflow request's other headers (as TorchServe passes them on)."""
    if len(parents) == 1:
        body, content_type = outputs[parents[0]], ""
    else:
        body, content_type = _form({p: outputs[p] for p in parents})
    lines = request.raw_headers.split(b"\r\n") if request.raw_headers else []
    kept = [line for line in lines if not line.lower().startswith(_BODY_HEADERS)]
    return WireRequest(
        request_id="", body=body, content_type=content_type, raw_headers=b"\r\n".join(kept)
    )


def _form(fields: dict[str, bytes]) -> tuple[bytes, str]:
    """multipart/form-data with each field as a file part, so its handler gets bytes. Its
    boundary occurs in no field: a parent's output (the client's bytes, passed on) cannot cut
    another field short or add one."""
    boundary = _BOUNDARY
    while any(boundary.encode() in value for value in fields.values()):
        boundary = f"{_BOUNDARY}-{secrets.token_hex(16)}"
    chunks: list[bytes] = []
    for name, value in fields.items():
        chunks += [
            f"--{boundary}\r\n".encode(),
            f'Content-Disposition: form-data; name="{name}"; filename="{name}"\r\n'.encode(),
            b"Content-Type: application/octet-stream\r\n\r\n",
            value,
            b"\r\n",
        ]
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


def _answer(leaves: dict[str, bytes]) -> bytes:
    """The only leaf's output as it is; several: a JSON object of each leaf's output by name."""
    if len(leaves) == 1:
        return next(iter(leaves.values()))
    fields = [
        json.dumps(name).encode() + b": " + _json_value(body) for name, body in leaves.items()
    ]
    return b"{" + b", ".join(fields) + b"}"


def _json_value(body: bytes) -> bytes:
    """A leaf's output as it came when it is one JSON value in UTF-8 (never parsed and written
    again: 1e999 stays 1e999, not Python's Infinity, which no JSON reader takes), else its text
    as a JSON string: NaN or Infinity, a value nested past the parser's limit, other bytes."""
    try:
        text = body.decode("utf-8")
        json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        return json.dumps(body.decode("utf-8", "replace")).encode()
    return text.strip().encode()


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is no JSON value")
