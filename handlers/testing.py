"""Test a handler without a server: a ``Context`` factory and the worker's own predict path.

Usable from pytest (torch is imported only when a handler that needs it is loaded)::

    from torchbay.handlers.testing import run_handler

    replies = run_handler("model_store/iris.mar", [[5.1, 3.5, 1.4, 0.2], b"not json"])
    assert replies[0].status == 200 and replies[0].json()["label"] == "setosa"
    assert replies[1].status == 400

What runs is exactly what a worker runs: ``handlers.runtime.service.load_service`` loads the handler
(archive manifest, ``model-config.yaml``, the ``ts`` alias, ``initialize``) and
``Service.predict`` answers each batch (per-request decoding, the error statuses, the response
envelope, the bisecting of a batch that raises). Each reply is the ``(status, headers, body)``
the HTTP listener would write for that request.

* ``run_handler(handler_or_archive, requests, ...)``: load, run, return one ``Reply`` each.
* ``load_handler(handler_or_archive, ...)``: a context manager giving a ``Runner`` that keeps the
  model loaded across calls (``runner.run(requests)``, ``runner.metrics``).
* ``make_context(...)``: the ``Context`` a worker builds, for unit tests of handler methods.
* ``make_request(body, ...)``: one request, as the listener builds it.
* ``import_by_path(path, name)``: a Python file imported once per process under a name of its
  own (how the examples import their ``model.py``).
* ``example_out(doc, default)`` and ``package_example(store, **options)``: what every example's
  build script shares, its ``--out`` argument and the archiver call that ends it.

A streaming handler (``send_intermediate_predict_response`` or a generator, see
``handlers.streaming``) is run the same way: each ``Reply.parts`` holds what it streamed, in
order, and ``Reply.streamed`` the parts and the final body joined, as a client reads them.

``handler_or_archive`` is an archive (``.mar``, ``.tar.gz``, ``.tgz`` or an unpacked archive
folder: unpacked with the server's safety checks), a handler spec (a built-in name such as
``"image_classifier"``, or ``"file.py[:function]"`` inside ``model_dir``), a path to a handler
``.py`` file (its folder is the model directory), or a handler object (a ``BaseHandler``-style
class or instance, or a ``handle(data, context)`` function).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from .context import Context
from .metrics import MetricsCache
from .runtime.service import Request, Service, load_service
from .utils import exec_file

__all__ = [
    "CONTENT_TYPES",
    "Reply",
    "Runner",
    "example_out",
    "import_by_path",
    "load_handler",
    "make_context",
    "make_request",
    "package_example",
    "run_handler",
]

CONTENT_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".json": "application/json",
    ".npy": "application/x-npy",
    ".txt": "text/plain",
}
_ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz", ".zip")
_MANIFEST = Path("MAR-INF") / "MANIFEST.json"


def import_by_path(path: str | Path, name: str) -> ModuleType:
    """The Python file ``path`` imported as module ``name``, once per process: later calls give
    the same module. Every example has a ``model.py``, so a plain ``import model`` would find
    whichever was imported first; each imports its own by path under a name of its own."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    return exec_file(path, name)


def example_out(doc: str, default: Path) -> Path:
    """An example build script's output folder: its ``--out`` argument (``default`` when not
    given), resolved. ``doc`` is the script's docstring; ``--help`` shows its first line."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default)
    return parser.parse_args().out.resolve()


def package_example(store: str | os.PathLike, **options: Any) -> Path:
    """Package one archive of an example into the folder ``store``, as version 1.0, replacing an
    older one; returns its path. The same as ``torchbay.archiver.package.package(ArchiveOptions(
    version="1.0", export_path=store, force=True, **options))`` (``torchbay archive --force``)."""
    from torchbay.archiver.package import ArchiveOptions, package

    return package(ArchiveOptions(version="1.0", export_path=Path(store), force=True, **options))


def package_example_model(here: Path, out: Path, name: str, handler: str, **options: Any) -> Path:
    """:func:`package_example` of an example in the examples' layout: its model class in
    ``here/model.py``, and what its build wrote to ``out``: the state dict ``<name>.pt`` and
    ``model-config.yaml``; the archive ``name`` goes to ``out/model_store``."""
    return package_example(
        out / "model_store",
        model_name=name,
        model_file=here / "model.py",
        serialized_file=out / f"{name}.pt",
        handler=handler,
        config_file=out / "model-config.yaml",
        **options,
    )


@dataclass(frozen=True)
class Reply:
    """One response as the listener writes it: status, headers (lower-case names, with
    ``content-type``) and body."""

    status: int
    headers: dict[str, str]
    body: bytes
    parts: tuple[bytes, ...] = ()  # what a streaming handler sent before ``body``, in order

    def __iter__(self) -> Iterator[Any]:
        """``status, headers, body = reply``."""
        return iter((self.status, self.headers, self.body))

    @property
    def streamed(self) -> bytes:
        """Every part and then the final body, as a client of the chunked response reads it."""
        return b"".join((*self.parts, self.body))

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


def make_context(
    model_dir: str | os.PathLike = ".",
    *,
    model_name: str = "model",
    manifest: dict[str, Any] | None = None,
    batch_size: int = 1,
    gpu_id: int | None = None,
    model_yaml_config: dict[str, Any] | None = None,
    server_version: str = "",
    limit_max_image_pixels: bool = True,
) -> Context:
    """The ``Context`` a worker gives ``initialize``: system properties, manifest,
    ``model_yaml_config`` and a metrics cache (``context.metrics``)."""
    return Context(
        model_name,
        str(Path(model_dir).resolve()),
        manifest if manifest is not None else {"model": {"modelName": model_name}},
        batch_size,
        gpu_id,
        server_version,
        limit_max_image_pixels,
        MetricsCache(model_name),
        dict(model_yaml_config or {}),
    )


def make_request(
    body: Any,
    *,
    content_type: str | None = None,
    headers: dict[str, str] | None = None,
    query: str = "",
    protocol: str = "predict",
    request_id: str = "0",
) -> Request:
    """One request as the listener builds it. ``body``: bytes (application/octet-stream), str
    (text/plain), a dict or list (JSON; for ``protocol="v2"`` an Open Inference Protocol
    request), or a ``Path`` (its bytes; the content type from its suffix)."""
    if isinstance(body, Path):
        content_type = content_type or CONTENT_TYPES.get(
            body.suffix.lower(), "application/octet-stream"
        )
        body = body.read_bytes()
    elif isinstance(body, (bytes, bytearray, memoryview)):
        body = bytes(body)
        content_type = content_type or "application/octet-stream"
    elif isinstance(body, str):
        body = body.encode()
        content_type = content_type or "text/plain; charset=utf-8"
    else:
        body = json.dumps(body).encode()
        content_type = content_type or "application/json"
    all_headers = {k.lower(): v for k, v in (headers or {}).items()}
    all_headers.setdefault("content-type", content_type)
    return Request(request_id, body, content_type, all_headers, query, protocol)


def _as_requests(requests: Iterable[Any], protocol: str, start: int) -> list[Request]:
    out = []
    for i, item in enumerate(requests, start):
        if isinstance(item, Request):
            out.append(item)
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str):
            out.append(
                make_request(item[0], content_type=item[1], protocol=protocol, request_id=str(i))
            )
        else:
            out.append(make_request(item, protocol=protocol, request_id=str(i)))
    return out


class _CollectSink:
    """The worker's part sink, for tests: keeps each request's streamed parts."""

    def __init__(self) -> None:
        self.parts: dict[str, list[bytes]] = {}

    def send(self, request_id: str, response: Any) -> None:
        self.parts.setdefault(request_id, []).append(bytes(response.body))

    def cancelled(self, request_id: str) -> bool:
        return False


@dataclass
class Runner:
    """A loaded handler: ``run`` answers requests in batches of at most ``batch_size``."""

    service: Service
    batch_size: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    _count: int = 0

    @property
    def handler(self) -> Any:
        return self.service.handler

    @property
    def context(self) -> Context:
        return self.service.context

    def run(self, requests: Sequence[Any], *, protocol: str = "predict") -> list[Reply]:
        """One ``Reply`` per request, in order. Items: see ``make_request`` (or a ``Request``,
        or a ``(body, content_type)`` pair)."""
        batch = _as_requests(requests, protocol, self._count)
        self._count += len(batch)
        replies: list[Reply] = []
        sink = _CollectSink()
        self.service.part_sink = sink  # streamed parts land here, as on the worker's socket
        for lo in range(0, len(batch), self.batch_size):
            chunk = batch[lo : lo + self.batch_size]
            outcome = self.service.predict(chunk)
            self.metrics.extend(outcome.metrics)
            for stage, ms in outcome.timings.items():
                self.timings[stage] = self.timings.get(stage, 0.0) + ms
            for req, r in zip(chunk, outcome.responses, strict=True):
                headers = {"content-type": r.content_type, **r.headers}
                parts = tuple(sink.parts.pop(req.request_id, ()))
                replies.append(Reply(r.status, headers, bytes(r.body), parts))
        return replies


def _is_archive(target: Any) -> bool:
    if not isinstance(target, (str, os.PathLike)):
        return False
    path = Path(target)
    if path.is_dir():
        return (path / _MANIFEST).is_file()
    return path.is_file() and path.name.lower().endswith(_ARCHIVE_SUFFIXES)


def _object_service(handler: Any, context: Context) -> Service:
    """A Service around a handler object, initialized as ``load_service`` initializes one."""
    from .runtime.resolve import ResolvedHandler, install_ts_alias

    install_ts_alias()
    if isinstance(handler, type):
        handler = handler()
    if hasattr(handler, "handle"):
        resolved = ResolvedHandler(type(handler).__name__, handler.handle, handler)
        if hasattr(handler, "initialize"):
            handler.initialize(context)
    elif callable(handler):
        resolved = ResolvedHandler(getattr(handler, "__name__", "handle"), handler)
        handler(None, context)  # TorchServe calls a function handler once with data=None
    else:
        raise TypeError(f"not a handler: {handler!r}")
    device = str(getattr(resolved.instance, "device", None) or "cpu")
    context.metrics.drain()
    return Service(context, resolved, device, context.model_name, "")


@contextlib.contextmanager
def load_handler(
    handler_or_archive: Any,
    *,
    model_dir: str | os.PathLike | None = None,
    batch_size: int = 1,
    gpu_id: int | None = None,
    model_name: str | None = None,
    model_yaml_config: dict[str, Any] | None = None,
) -> Iterator[Runner]:
    """Load a handler as a worker does; yields a ``Runner``. An archive is unpacked (with the
    server's checks) into a temporary folder removed on exit. ``model_yaml_config`` applies to
    handler objects only (an archive or model folder has its own ``model-config.yaml``); a
    handler object with ``model_dir`` gets that folder's manifest, so ``BaseHandler`` subclasses
    load its model."""
    target = handler_or_archive
    with tempfile.TemporaryDirectory(prefix="torchbay-test-") as tmp:
        if _is_archive(target):
            from torchbay.archiver.extract import extract_archive

            folder = Path(tmp) / "model"
            extract_archive(Path(target), folder)
            service = load_service(
                folder, batch_size=batch_size, gpu_id=gpu_id, model_name=model_name
            )
        elif isinstance(target, (str, os.PathLike)):
            spec, folder = str(target), Path(model_dir) if model_dir is not None else Path(tmp)
            if model_dir is None and spec.endswith(".py") and Path(spec).is_file():
                spec, folder = Path(spec).name, Path(spec).resolve().parent
            service = load_service(
                folder, handler=spec, batch_size=batch_size, gpu_id=gpu_id, model_name=model_name
            )
        else:
            folder = Path(model_dir) if model_dir is not None else Path(tmp)
            from .runtime.loading import (
                read_manifest,  # a model folder's manifest, as load_service reads
            )

            manifest = read_manifest(folder) if model_dir is not None else None
            context = make_context(
                folder,
                model_name=model_name or "model",
                manifest=manifest,
                batch_size=batch_size,
                gpu_id=gpu_id,
                model_yaml_config=model_yaml_config,
            )
            service = _object_service(target, context)
        yield Runner(service, max(1, batch_size))


def run_handler(
    handler_or_archive: Any,
    requests: Sequence[Any],
    *,
    model_dir: str | os.PathLike | None = None,
    batch_size: int | None = None,
    protocol: str = "predict",
    gpu_id: int | None = None,
    model_yaml_config: dict[str, Any] | None = None,
) -> list[Reply]:
    """Load the handler, answer ``requests`` (in batches of ``batch_size``, default: all in one
    batch) and return one ``Reply`` per request, in order."""
    size = batch_size or max(1, len(requests))
    with load_handler(
        handler_or_archive,
        model_dir=model_dir,
        batch_size=size,
        gpu_id=gpu_id,
        model_yaml_config=model_yaml_config,
    ) as runner:
        return runner.run(requests, protocol=protocol)
