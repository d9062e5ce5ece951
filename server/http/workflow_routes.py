"""TorchServe's workflow management routes (``/workflows``) on the management listener: thin
adapters over ``server/workflows``' operations (``Workflows``). ``/wfpredict/{name}`` on the
inference listener is ``wfpredict.py``.

    GET    /workflows?limit=&next_page_token=     list (a page of) workflows
    POST   /workflows?url=&workflow_name=         register a .war of the workflow store (model API)
    GET    /workflows/{name}                      describe: a JSON array
    DELETE /workflows/{name}                      unregister it and its nodes (model API)
    PUT    /workflows/{name}                      405, as TorchServe (no scaling of workflows)
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from torchbay.server.config.sources import api_int
from torchbay.server.errors import MethodNotAllowed
from torchbay.server.http.model_routes import management_key, status
from torchbay.server.http.openapi import documented
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
    raise MethodNotAllowed(
        "Requested method is not allowed, please refer to API document.",
        headers={"Allow": "DELETE, GET"},  # RFC 9110: a 405 names what the path takes
    )
