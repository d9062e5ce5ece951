"""The inference listener's routes of Triton's shared-memory extensions (system and CUDA), as
``routes.Route`` values for ``route_table.INFERENCE_ROUTES``; answered by ``http/shm.py``.
Torch-free."""

from __future__ import annotations

from typing import Any

from torchbay.server.http.routes import OK, Route


def _regions(**fields: str) -> dict[str, Any]:
    """The schema of a status answer: a list of regions with ``fields`` (name -> JSON type)."""
    properties = {name: {"type": kind} for name, kind in fields.items()}
    return {"type": "array", "items": {"type": "object", "properties": properties}}


_SYSTEM_STATUS = _regions(name="string", key="string", offset="integer", byte_size="integer")
_CUDA_STATUS = _regions(name="string", device_id="integer", byte_size="integer")
_SYSTEM_BODY = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["key", "byte_size"],
                "properties": {
                    "key": {"type": "string"},
                    "offset": {"type": "integer", "minimum": 0},
                    "byte_size": {"type": "integer", "minimum": 1},
                },
            }
        }
    }
}
_CUDA_BODY = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "raw_handle": {"type": "object", "properties": {"b64": {"type": "string"}}},
                    "device_id": {"type": "integer"},
                    "byte_size": {"type": "integer"},
                },
            }
        }
    }
}
_TEXT = (
    "Needs allow_client_shm (--allow-client-shm); registering and unregistering need the "
    "management key (token authorization on)."
)


def shm_routes() -> tuple[Route, ...]:
    """``/v2/systemsharedmemory`` and ``/v2/cudasharedmemory``: status, register, unregister."""
    return (
        *_family("systemsharedmemory", "shm", "system", _SYSTEM_STATUS, _SYSTEM_BODY),
        *_family("cudasharedmemory", "cuda_shm", "CUDA", _CUDA_STATUS, _CUDA_BODY),
    )


def _family(
    segment: str, prefix: str, label: str, status: dict[str, Any], body: dict[str, Any]
) -> tuple[Route, ...]:
    base, region = f"/v2/{segment}", f"/v2/{segment}/region/{{region_name}}"
    answers = {"200": (f"The registered {label} shared-memory regions", status)}

    def route(method: str, path: str, op: str, summary: str, **kw: Any) -> Route:
        key = "inference" if op == "status" else "management"
        return Route(
            method,
            path,
            f"{prefix}_{op}",
            summary,
            (401, 404) if op == "status" else (400, 401, 501),  # 404: no such region; 501: off
            kw.pop("answers", OK),
            oip=True,
            auth=True,
            key=key,
            strict=True,
            description=_TEXT,
            **kw,
        )

    return (
        route("GET", base + "/status", "status", f"Every {label} region", answers=answers),
        route("GET", region + "/status", "status", f"One {label} region", answers=answers),
        route("POST", region + "/register", "register", f"Register a {label} region", body=body),
        route("POST", base + "/unregister", "unregister", f"Unregister every {label} region"),
        route("POST", region + "/unregister", "unregister", f"Unregister a {label} region"),
    )
