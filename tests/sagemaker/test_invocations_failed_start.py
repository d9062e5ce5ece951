"""SageMaker's ``POST /invocations`` naming no model, when a start-up model failed to load.
TorchServe keeps such a model registered (its workers retrying): its one start-up model is still
the one ``/invocations`` serves, and two start-up models still need ``model_name``. torchbay
drops it, and answered as if it had never been asked for: 400 "Parameter model_name is
required." (the client blamed for the operator's model), or, with a second start-up model, that
model's answer to a request sent to the first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import running, tiny_archive

FAILS = """\
from torchbay.handlers.base_handler import BaseHandler


class Fails(BaseHandler):
    def initialize(self, context):
        raise RuntimeError("no GPU here")
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root, work = tmp_path_factory.mktemp("failed-start"), tmp_path_factory.mktemp("fs-build")
    tiny_archive(work, root, "tiny", "tensor")
    (work / "fails.py").write_text(FAILS)
    tiny_archive(work, root, "fails", str(work / "fails.py"))
    yield root


def _invoke(server) -> httpx.Response:
    return httpx.post(f"{server.url}/invocations", json={"data": [0.0] * 64}, timeout=60)


def test_the_only_start_up_model_failed_is_a_503_naming_it(store: Path) -> None:
    with running(store, load_models=["fails.mar"]) as server:
        r = _invoke(server)
    assert r.status_code == 503, r.text
    assert r.json()["message"] == (
        "The start-up model fails.mar did not load (see the server's log): "
        "no model serves /invocations"
    )


def test_with_another_start_up_model_the_model_name_is_still_required(store: Path) -> None:
    with running(store, load_models=["fails.mar", "tiny.mar"]) as server:
        r = _invoke(server)
        named = httpx.post(
            f"{server.url}/invocations?model_name=tiny", json={"data": [0.0] * 64}, timeout=60
        )
    assert r.status_code == 400, r.text
    assert r.json()["message"] == "Parameter model_name is required."
    assert named.status_code == 200, named.text
