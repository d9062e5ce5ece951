"""TorchServe's ``POST /wfpredict/{name}`` on the inference listener: its routes (for
``route_table.INFERENCE_ROUTES``) and its endpoint, which reads the body and runs the workflow's
DAG (``server/workflows/executor.py``), whose node requests are the plane's exchanges. A client
that disconnects while the DAG runs cancels it (``disconnect.LEFT``, as a model request): the
nodes still running or queued are cancelled, and none is started after.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from torchbay.server.http.asgi import Receive, Scope, Send, header, read_body, send_bytes
from torchbay.server.http.disconnect import LEFT
from torchbay.server.http.routes import OK, Route
from torchbay.server.plane import WireRequest, join_headers
from torchbay.server.workflows import executor
from torchbay.server.workflows.manager import Workflows
from torchbay.server.workflows.workflow import Workflow

# POST, PUT (curl -T, as TorchServe's docs upload) and GET (a query alone): TorchServe 0.12
# answers each (tests/data/torchserve/workflows: predict_put, predict_get), as /predictions, and
# with a trailing slash or more segments after the name (predict_trailing_slash, _more_segments).
WFPREDICT_ROUTES = tuple(
    Route(
        method,
        "/wfpredict/{workflow_name}",
        "wfpredict",
        "Run a workflow: its DAG's nodes in order, each a request to its model",
        (400, 401, 404, 413, 500, 503),
        OK,
        auth=True,
        body={"content": {"*/*": {"schema": {"type": "string", "format": "binary"}}}},
        description="One leaf: its output as it is; several: a JSON object by node name. "
        "A trailing slash or further path segments are ignored, as TorchServe ignores them.",
        suffix=True,  # a trailing slash, further segments: taken and ignored, as TorchServe
        any_method=method == "POST",  # DELETE, PATCH...: run it too (predict_delete, _patch)
    )
    for method in ("POST", "PUT", "GET")
)


class WorkflowPredict:
    """The ``wfpredict`` endpoint of the inference app (``InferenceApp`` looks it up by name)."""

    def __init__(self, workflows: Workflows, *, max_request_size: int, authorize: Any) -> None:
        self.workflows = workflows
        self.max_request_size = max_request_size
        self.authorize = authorize

    async def wfpredict(
        self, scope: Scope, receive: Receive, send: Send, match: re.Match[str]
    ) -> None:
        if self.authorize is not None:
            self.authorize(scope, "inference")
        self.workflows.get(match["workflow_name"])  # 404 before the body is read
        body = await read_body(scope, receive, self.max_request_size)
        # Again: it may have been unregistered while the body came (its nodes gone: a 404, not
        # a 500 at its first node). Counted from here, with no await between, so that an
        # unregistration from now on waits for this run (Workflow.running).
        workflow = self.workflows.get(match["workflow_name"])
        content_type = header(scope, b"content-type")
        request = WireRequest(
            request_id="",
            body=body,
            content_type=content_type.decode("latin-1") if content_type else "",
            query=scope.get("query_string", b"").decode("latin-1"),
            raw_headers=join_headers(scope["headers"]),
        )
        with workflow.running():
            answer = await self._run(scope, workflow, request)
        if answer is not None:
            await send_bytes(send, 200, answer)

    async def _run(self, scope: Scope, workflow: Workflow, request: WireRequest) -> bytes | None:
        """The DAG's answer; None when the client left (its nodes cancelled)."""
        run = asyncio.ensure_future(executor.run(self.workflows.plane, workflow, scope, request))
        left: list[bool] = []
        scope[LEFT] = lambda: left.append(run.cancel())  # the protocol calls it (disconnect.py)
        try:
            return await run
        except asyncio.CancelledError:
            if not left:
                raise  # this task itself was cancelled (the server stops)
            return None  # the client is gone: nobody to answer
        finally:
            del scope[LEFT]
