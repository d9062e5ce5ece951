"""Example tests: build each example with its own build script, serve it with the real server.

``serve(store, models)`` starts the live server of tests/server/conftest.py (real uvicorn on
127.0.0.1 port 0, real workers) over the example's model store and stops it after the test.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _import(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_server = _import(REPO / "tests" / "server" / "conftest.py", "_examples_live_server")


def example_module(example: str, module: str = "build") -> ModuleType:
    """``examples/<example>/<module>.py``, imported by path (the examples are not a package)."""
    return _import(EXAMPLES / example / f"{module}.py", f"_example_{example}_{module}")


@pytest.fixture
def serve() -> Iterator[Callable[..., Any]]:
    """``serve(store, models={name: {"1.0": {...}}}, **config)`` -> a started LiveServer."""
    servers: list[Any] = []

    def start(store: Path, **overrides: Any) -> Any:
        server = _server.LiveServer(_server.make_config(store, **overrides)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def model_entry(mar: str, **settings: Any) -> dict[str, Any]:
    """One model's ``models`` entry (TorchServe's camelCase settings), version 1.0."""
    return {"1.0": {"marName": mar, "defaultVersion": True, **settings}}


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` and holds almost no data: what a client sends
    to make a decoder allocate (PIL refuses past 2 x its pixel limit, DecompressionBombError)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
    return b"\x89PNG\r\n\x1a\n" + body + chunk(b"IEND", b"")
