"""``torchbay models list|describe|register|scale|unregister|set-default``: a client of a running
server's management API, for people who do not write curl.

``ManagementClient`` is the core (tests call it directly); each verb calls one of its methods and
prints a table, or the server's JSON with ``--json``. The key comes from ``--token``, else from
the server's key file (``--key-file``, default ``key_file.json`` when it exists). Every failure
raises ``ClientError`` with one clear line (the CLI prints it and exits 1). Torch-free.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from torchbay.server.errors import TorchbayError

DEFAULT_URL = "http://127.0.0.1:8081"
DEFAULT_KEY_FILE = Path("key_file.json")


class ClientError(TorchbayError):
    """The server could not be reached, or answered with an error."""

    code = "client_error"


def load_token(token: str | None, key_file: Path | None) -> str | None:
    """``token`` if given; else the management key of ``key_file`` (or ./key_file.json if it
    exists); else None (a server with token auth off)."""
    if token:
        return token
    path = key_file
    if path is None:
        if not DEFAULT_KEY_FILE.is_file():
            return None
        path = DEFAULT_KEY_FILE
    try:
        data = json.loads(Path(path).read_text())
        return str(data["management"]["key"])
    except OSError as exc:
        raise ClientError(f"cannot read key file {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError):
        raise ClientError(f"{path} is not a torchbay/TorchServe key file") from None


class ManagementClient:
    """Calls to one server's management API. Methods return the server's JSON."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 300.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ManagementClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, params: dict[str, Any] | None = None) -> Any:
        params = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        try:
            r = self._http.request(method, path, params=params)
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach the management API at {self.url}: {exc}") from None
        try:
            body = r.json()
        except ValueError:
            body = None
        if r.status_code >= 400:
            if isinstance(body, dict) and "message" in body:
                kind = body.get("type", "Error")
                raise ClientError(f"{r.status_code} {kind}: {body['message']}")
            raise ClientError(f"{r.status_code} from {method} {path}: {r.text[:200]}")
        if body is None:
            raise ClientError(f"{method} {path} answered {r.status_code} without JSON")
        return body

    def list_models(self) -> list[dict[str, Any]]:
        """Every registered model (follows the pages)."""
        models: list[dict[str, Any]] = []
        token: str | None = "0"
        while token is not None:
            page = self._call("GET", "/models", {"limit": 100, "next_page_token": token})
            models.extend(page.get("models", []))
            token = page.get("nextPageToken")
        return models

    def describe(self, name: str, version: str | None = None) -> list[dict[str, Any]]:
        """Describe the default version, one version, or ``all``."""
        path = f"/models/{_seg(name)}" + (f"/{_seg(version)}" if version else "")
        return self._call("GET", path)

    def register(
        self,
        url: str,
        *,
        model_name: str | None = None,
        handler: str | None = None,
        batch_size: int | None = None,
        max_batch_delay: float | None = None,
        initial_workers: int | None = None,
        response_timeout: float | None = None,
        synchronous: bool = True,
    ) -> dict[str, Any]:
        return self._call(
            "POST",
            "/models",
            {
                "url": url,
                "model_name": model_name,
                "handler": handler,
                "batch_size": batch_size,
                "max_batch_delay": max_batch_delay,
                "initial_workers": initial_workers,
                "response_timeout": response_timeout,
                "synchronous": synchronous,
            },
        )

    def scale(
        self,
        name: str,
        version: str | None = None,
        *,
        min_worker: int | None = None,
        max_worker: int | None = None,
        batch_size: int | None = None,
        max_batch_delay: float | None = None,
        synchronous: bool = True,
    ) -> dict[str, Any]:
        path = f"/models/{_seg(name)}" + (f"/{_seg(version)}" if version else "")
        return self._call(
            "PUT",
            path,
            {
                "min_worker": min_worker,
                "max_worker": max_worker,
                "batch_size": batch_size,
                "max_batch_delay": max_batch_delay,
                "synchronous": synchronous,
            },
        )

    def set_default(self, name: str, version: str) -> dict[str, Any]:
        return self._call("PUT", f"/models/{_seg(name)}/{_seg(version)}/set-default")

    def unregister(self, name: str, version: str | None = None) -> dict[str, Any]:
        path = f"/models/{_seg(name)}" + (f"/{_seg(version)}" if version else "")
        return self._call("DELETE", path)


def _param(value: Any) -> Any:
    return str(value).lower() if isinstance(value, bool) else value


def _seg(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")


# -- output -----------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def format_models(models: list[dict[str, Any]]) -> str:
    if not models:
        return "no models registered"
    return table(("MODEL", "URL"), [(m.get("modelName"), m.get("modelUrl")) for m in models])


def format_describe(described: list[dict[str, Any]]) -> str:
    blocks = []
    for d in described:
        default = " (default)" if d.get("isDefault") else ""
        head = table(
            ("MODEL", "VERSION", "STATUS", "WORKERS", "BATCH", "DELAY_MS", "QUEUE", "URL"),
            [
                (
                    d.get("modelName"),
                    f"{d.get('modelVersion')}{default}",
                    d.get("status"),
                    f"{len(d.get('workers', []))} ({d.get('minWorkers')}-{d.get('maxWorkers')})",
                    d.get("batchSize"),
                    d.get("maxBatchDelay"),
                    d.get("jobQueueStatus", {}).get("pendingRequests"),
                    d.get("modelUrl"),
                )
            ],
        )
        workers = d.get("workers") or []
        if workers:
            rows = [
                (
                    w.get("id"),
                    w.get("pid"),
                    w.get("state", w.get("status")),  # torchbay's finer state
                    w.get("device"),
                    f"{(w.get('memoryUsage') or 0) / 2**20:.0f} MiB",
                    w.get("startTime"),
                )
                for w in workers
            ]
            head += "\n\n" + table(("WORKER", "PID", "STATUS", "DEVICE", "MEMORY", "STARTED"), rows)
        blocks.append(head)
    return "\n\n".join(blocks)


# -- CLI --------------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    models = subparsers.add_parser(
        "models",
        help="manage models on a running server (list, describe, register, scale, ...)",
        description="Call a running server's management API.",
    )
    verbs = models.add_subparsers(dest="models_verb", metavar="ACTION", required=True)

    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--url", default=DEFAULT_URL, help=f"management API (default {DEFAULT_URL})")
        p.add_argument("--token", help="the management key (default: read from the key file)")
        p.add_argument(
            "--key-file",
            type=Path,
            help="the server's key file (default: ./key_file.json when it exists)",
        )
        p.add_argument("--json", action="store_true", help="print the server's JSON")
        return p

    verb("list", "list registered models").set_defaults(func=_run, action="list")
    p = verb("describe", "describe a model's versions and workers")
    p.add_argument("name")
    p.add_argument("version", nargs="?", help="a version, or 'all' (default: the default one)")
    p.set_defaults(func=_run, action="describe")

    p = verb("register", "register an archive (needs --enable-model-api on the server)")
    p.add_argument("archive", help="a .mar in the server's model store, or an allowed URL")
    p.add_argument("--name", help="model name (default: from the archive)")
    p.add_argument("--handler", help="override the archive's handler")
    p.add_argument("--workers", type=int, help="initial workers")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--max-batch-delay", type=float, help="milliseconds")
    p.add_argument("--response-timeout", type=float, help="seconds")
    p.add_argument("--no-wait", action="store_true", help="return before the workers start")
    p.set_defaults(func=_run, action="register")

    p = verb("scale", "set a model version's workers (and batching)")
    p.add_argument("name")
    p.add_argument("version", nargs="?")
    p.add_argument("--min", dest="min_worker", type=int, help="workers (TorchServe min_worker)")
    p.add_argument("--max", dest="max_worker", type=int, help="default: --min")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--max-batch-delay", type=float, help="milliseconds")
    p.add_argument("--no-wait", action="store_true", help="return before the workers change")
    p.set_defaults(func=_run, action="scale")

    p = verb("unregister", "drain and unregister a model version")
    p.add_argument("name")
    p.add_argument("version", nargs="?")
    p.set_defaults(func=_run, action="unregister")

    p = verb("set-default", "choose the version /predictions/{model} serves")
    p.add_argument("name")
    p.add_argument("version")
    p.set_defaults(func=_run, action="set-default")


def run(args: argparse.Namespace) -> str:
    """Do what the parsed ``models`` verb asks; return the text to print."""
    token = load_token(args.token, args.key_file)
    with ManagementClient(args.url, token=token) as client:
        action = args.action
        if action == "list":
            result: Any = client.list_models()
            text = format_models(result)
        elif action == "describe":
            result = client.describe(args.name, args.version)
            text = format_describe(result)
        elif action == "register":
            result = client.register(
                args.archive,
                model_name=args.name,
                handler=args.handler,
                initial_workers=args.workers,
                batch_size=args.batch_size,
                max_batch_delay=args.max_batch_delay,
                response_timeout=args.response_timeout,
                synchronous=not args.no_wait,
            )
            text = result.get("status", "")
        elif action == "scale":
            if args.min_worker is None and args.batch_size is None and args.max_batch_delay is None:
                raise ClientError("scale needs --min, --batch-size or --max-batch-delay")
            result = client.scale(
                args.name,
                args.version,
                min_worker=args.min_worker,
                max_worker=args.max_worker,
                batch_size=args.batch_size,
                max_batch_delay=args.max_batch_delay,
                synchronous=not args.no_wait,
            )
            text = result.get("status", "")
        elif action == "unregister":
            result = client.unregister(args.name, args.version)
            text = result.get("status", "")
        else:
            result = client.set_default(args.name, args.version)
            text = result.get("status", "")
    return json.dumps(result, indent=2) if args.json else text


def _run(args: argparse.Namespace) -> int:
    print(run(args))
    return 0
