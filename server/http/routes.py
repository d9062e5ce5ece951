"""A route of the raw ASGI listeners' tables (``route_table.py``): each route once, with what its
dispatch needs (methods, path template, endpoint) and what its OpenAPI entry needs (summary,
statuses, schemas, auth).

:class:`Router` compiles a table for dispatch (a dict on the first path segment, then one
precompiled regex per path); ``server.http.openapi`` renders the same table as the document.
A path template's ``{name}`` matches one non-empty segment (an empty one on TorchServe's
``/predictions`` and ``/explanations``, as TorchServe splits them); ``suffix`` routes also take
further segments (``/predictions/m/v/more/path`` -> ``url_path``). Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchbay.server.errors import MethodNotAllowed, NotFound
from torchbay.server.http.asgi import Receive, Scope, Send

# An endpoint gets the path's match (its named groups are the template's parameters).
Endpoint = Callable[[Scope, Receive, Send, "re.Match[str]"], Awaitable[None]]
# (description, JSON schema, or the content type of a body that is not JSON)
Answer = tuple[str, "dict[str, Any] | str"]

_ANY = "*"  # the methods key of a path's ``any_method`` route
ROUTE_NOT_FOUND = "Requested resource is not found, please refer to API document."


@dataclass(frozen=True)
class Route:
    """One operation: ``method`` on ``path`` answered by the endpoint named ``endpoint``."""

    method: str
    path: str
    endpoint: str
    summary: str
    errors: tuple[int, ...] = ()  # statuses answered with the error schema
    answers: Mapping[str, Answer] = field(default_factory=dict)  # other statuses
    oip: bool = False  # errors are OIP's {"error"}; else TorchServe's {"code","type","message"}
    auth: bool = False  # needs a key (token authorization on): ``key``'s
    key: str = "inference"  # which key ``auth`` asks for: "inference" or "management"
    body: Mapping[str, Any] | None = None  # the OpenAPI requestBody
    description: str | None = None
    query: tuple[Mapping[str, Any], ...] = ()  # OpenAPI query parameters
    suffix: bool = False  # further path segments are taken (as ``url_path``)
    empty_segments: bool = False  # a path parameter may be empty
    strict: bool = False  # another method on this path is 405 (else 404)
    slash: bool = False  # trailing slashes are taken (TorchServe splits paths as Java does)
    # A method that no route of this path names is answered here too: TorchServe's own routes
    # check no method (DELETE /predictions/m runs the model, HEAD /ping is a health check).
    any_method: bool = False

    def params(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.path)


def _pattern(route: Route) -> re.Pattern[str]:
    segment = "[^/]*" if route.empty_segments else "[^/]+"
    parts = re.split(r"\{(\w+)\}", route.path)
    regex = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>{segment})" for i, part in enumerate(parts)
    )
    if route.suffix:
        regex += "(?:/(?P<url_path>.*))?"
    if route.oip or route.slash:
        regex += "/*"  # OIP paths take trailing slashes; so do SageMaker's on TorchServe
    return re.compile(regex + r"\Z")


def first_segment(path: str) -> str:
    end = path.find("/", 1)
    return path[1:end] if end > 0 else path[1:]


class Router:
    """A table's dispatch: ``resolve(path, method)`` -> (route, endpoint, match), or NotFound
    (no route's path matches) or MethodNotAllowed (a ``strict`` path, another method)."""

    def __init__(
        self,
        routes: tuple[Route, ...],
        endpoints: Mapping[str, Endpoint],
        *,
        oip_prefix: str | None = None,  # unrouted paths under it: OIP's "No route for" message
    ) -> None:
        self._oip_prefix = oip_prefix
        # first segment -> [(pattern, {method: (route, endpoint)}, strict)], in table order
        self._paths: dict[str, list[tuple[re.Pattern[str], dict[str, Any], bool]]] = {}
        seen: dict[str, dict[str, Any]] = {}
        for route in routes:
            methods = seen.get(route.path)
            if methods is None:
                methods = seen[route.path] = {}
                bucket = self._paths.setdefault(first_segment(route.path.split("{")[0]), [])
                bucket.append((_pattern(route), methods, route.strict))
            methods[route.method] = (route, endpoints[route.endpoint])
            if route.any_method:
                methods.setdefault(_ANY, methods[route.method])

    def resolve(self, path: str, method: str) -> tuple[Route, Endpoint, re.Match[str]]:
        """A path's first segment picks the routes to try; one that no route begins with tries
        the routes that begin with a parameter (TorchServe's legacy ``/{model}/predict``)."""
        routes = self._paths.get(first_segment(path))
        for pattern, methods, strict in routes if routes is not None else self._paths.get("", ()):
            match = pattern.match(path)
            if match is None:
                continue
            found = methods.get(method) or methods.get(_ANY)
            if found is not None:
                return found[0], found[1], match
            if strict:  # RFC 9110: a 405 names the methods the path takes
                allow = ", ".join(m for m in methods if m != _ANY)
                raise MethodNotAllowed(
                    f"{method} is not allowed on {path}", headers={"Allow": allow}
                )
        oip = self._oip_prefix is not None and path.startswith(self._oip_prefix)
        raise NotFound(f"No route for {method} {path}" if oip else ROUTE_NOT_FOUND)


# -- what every table shares ---------------------------------------------------------------------

OBJECT: dict[str, Any] = {"type": "object"}
OK: Mapping[str, Answer] = {"200": ("OK", OBJECT)}
JSON_BODY = {"content": {"application/json": {"schema": OBJECT}}}


def oip_route(
    method: str,
    path: str,
    endpoint: str,
    summary: str,
    errors: tuple[int, ...],
    answers: Mapping[str, Answer],
    body: dict[str, Any] | None = None,
) -> Route:
    """An Open Inference Protocol route: OIP errors, the inference key, 405 on other methods."""
    return Route(
        method,
        path,
        endpoint,
        summary,
        errors,
        answers,
        oip=True,
        auth=True,
        body=body,
        strict=True,
    )
