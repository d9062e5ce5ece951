"""TorchServe's workflow API: the management routes (``/workflows``) and ``/wfpredict/{name}`` on
the inference listener. Thin adapters over ``server/workflows``: the management routes call its
operations (``Workflows``), the prediction endpoint reads the body and runs the DAG
(``workflows.executor``), whose node requests are the plane's exchanges.

    GET    /workflows?limit=&next_page_token=     list (a page of) workflows
    POST   /workflows?url=&workflow_name=         register a .war of the workflow store (model API)
    GET    /workflows/{name}                      describe: a JSON array
    DELETE /workflows/{name}                      unregister it and its nodes (model API)
    POST   /wfpredict/{name}                      run the workflow on the request
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from torchbay.server.config.sources import api_int
from torchbay.server.errors import MethodNotAllowed
from torchbay.server.http.asgi import Receive, Scope, Send, header, read_body, send_bytes
from torchbay.server.http.model_routes import management_key, status
from torchbay.server.http.openapi import documented
from torchbay.server.http.routes import OK, Route
from torchbay.server.plane import WireRequest, join_headers
from torchbay.server.workflows import executor
from torchbay.server.workflows.manager import Workflows


def workflows_of(request: Request) -> Workflows:
    return request.app.state.workflows


State = Annotated[Workflows, Depends(workflows_of)]

workflows = APIRouter(dependencies=[Depends(management_key)])


@workflows.get("/workflows", **documented(400, 401))
async def list_workflows(
    state: State, limit: str | None = None, next_page_token: str | None = None
) -> dict[str, Any]:
    return state.list(api_int(limit), api_int(next_page_token))


@workflows.post("/workflows", **documented(400, 401, 404, 405, 409, 500))
async def register_workflow(
    state: State, url: str | None = None, workflow_name: str | None = None
) -> JSONResponse:
    return status(await state.register(url, workflow_name))


@workflows.get("/workflows/{name}", **documented(401, 404))
async def describe_workflow(state: State, name: str) -> list[dict[str, Any]]:
    return state.describe(name)


@workflows.delete("/workflows/{name}", **documented(401, 404, 405))
async def unregister_workflow(state: State, name: str) -> JSONResponse:
    return status(await state.unregister(name))


@workflows.api_route("/workflows/{name}", methods=["PUT", "POST"], include_in_schema=False)
async def other_method(name: str) -> None:
    """TorchServe answers 405 here: workflows are not scaled or updated through the API."""
    raise MethodNotAllowed("Requested method is not allowed, please refer to API document.")


# -- inference ----------------------------------------------------------------------------------

WFPREDICT_ROUTE = Route(
    "POST",
    "/wfpredict/{workflow_name}",
    "wfpredict",
    "Run a workflow: its DAG's nodes in order, each a request to its model",
    (400, 401, 404, 413, 500, 503),
    OK,
    auth=True,
    body={"content": {"*/*": {"schema": {"type": "string", "format": "binary"}}}},
    description="One leaf: its output as it is; several: a JSON object by node name.",
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
        workflow = self.workflows.get(match["workflow_name"])  # 404 before the body is read
        body = await read_body(scope, receive, self.max_request_size)
        content_type = header(scope, b"content-type")
        request = WireRequest(
            request_id="",
            body=body,
            content_type=content_type.decode("latin-1") if content_type else "",
            query=scope.get("query_string", b"").decode("latin-1"),
            raw_headers=join_headers(scope["headers"]),
        )
        answer = await executor.run(self.workflows.plane, workflow, scope, request)
        await send_bytes(send, 200, answer)
