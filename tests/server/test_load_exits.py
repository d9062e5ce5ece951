"""A model file or handler that ends its worker while it loads (``sys.exit(0)`` at import,
``os._exit(3)`` in ``initialize``): the registration's 500 named only the worker's exit code
("worker W-1-exits_1 exited with code 0 while loading"); now it says what the code did, as for
any other failure to load, and the server goes on serving its other models."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.tiny_sources import TINY_LINEAR_SOURCE, saved_model
from torchbay.archiver.package import ArchiveOptions, package

from .conftest import running, tiny_archive

INIT_EXIT = """\
import os

from torchbay.handlers.base_handler import BaseHandler


class Leaves(BaseHandler):
    def initialize(self, context):
        os._exit(3)
"""

# A child forked while the handler loads ends with os._exit, as multiprocessing's does: the
# child's own exit, not the loading code's.
FORKS = """\
import multiprocessing

from torchbay.handlers.base_handler import BaseHandler


def _nothing():
    pass


class Forks(BaseHandler):
    def initialize(self, context):
        child = multiprocessing.get_context("fork").Process(target=_nothing)
        child.start()
        child.join(60)
        self.child_exit = child.exitcode
        self.initialized = True

    def handle(self, data, context):
        return [{"child_exit": self.child_exit} for _ in data]
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root, work = tmp_path_factory.mktemp("exits"), tmp_path_factory.mktemp("exits-build")
    tiny_archive(work, root, "tiny", "tensor")
    saved_model(work, "tiny.py", TINY_LINEAR_SOURCE, "Tiny", "tiny.pt")
    (work / "tiny.py").write_text("import sys\nsys.exit(0)\n" + TINY_LINEAR_SOURCE)
    fields = {"version": "1", "handler": "tensor", "export_path": root}
    package(
        ArchiveOptions(
            model_name="imports_exit",
            model_file=work / "tiny.py",
            serialized_file=work / "tiny.pt",
            **fields,
        )
    )
    (work / "leaves.py").write_text(INIT_EXIT)
    tiny_archive(work, root, "init_exit", str(work / "leaves.py"))
    (work / "forks.py").write_text(FORKS)
    tiny_archive(work, root, "forks", str(work / "forks.py"))
    return root


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("imports_exit", "importing 'tiny.py' failed: SystemExit(0)"),
        ("init_exit", "handler 'leaves.py' failed to initialize: os._exit(3) called"),
    ],
)
def test_a_model_that_exits_while_loading_fails_to_load_with_its_reason(
    store: Path, name: str, reason: str
) -> None:
    with running(store, load_models=["tiny.mar"], enable_model_api=True) as server:
        r = httpx.post(
            f"{server.management_url}/models",
            params={"url": f"{name}.mar", "initial_workers": 1, "synchronous": "true"},
            timeout=120,
        )
        assert r.status_code == 500, r.text
        assert r.json()["message"] == reason
        ok = httpx.post(f"{server.url}/predictions/tiny", json={"data": [0.0] * 64}, timeout=60)
        assert ok.status_code == 200, ok.text


def test_a_child_the_handler_forks_while_it_loads_exits_as_its_own(store: Path) -> None:
    with running(store, load_models=["forks.mar"]) as server:
        r = httpx.post(f"{server.url}/predictions/forks", json={"data": [1]}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json() == {"child_exit": 0}
