"""TorchServe's ``blacklist_env_vars`` (a regex over variable names, matched whole: the
variables a worker's handler must not see, such as the host's credentials) on a real server:
the handler of ``envs`` answers what ``os.environ`` holds of two variables set in the
server's environment."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import LiveServer, make_config, tiny_archive

pytestmark = pytest.mark.slow

HANDLER = """
import json
import os


def handle(data, context):
    if data is None:
        return None
    names = ("TB_HIDDEN_SECRET", "TB_SHOWN_SETTING")
    seen = {n: os.environ.get(n) for n in names}
    with open("/proc/self/environ", "rb") as f:  # the process's initial environment
        block = f.read()
    seen["proc"] = b"TB_HIDDEN_SECRET=" in block
    seen["proc_shown"] = b"TB_SHOWN_SETTING=" in block
    return [json.dumps(seen)] * len(data)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("blacklist-store")
    work = tmp_path_factory.mktemp("blacklist-build")
    handler = work / "env_handler.py"
    handler.write_text(HANDLER)
    tiny_archive(work, root, "envs", str(handler))
    saved = {n: os.environ.get(n) for n in ("TB_HIDDEN_SECRET", "TB_SHOWN_SETTING")}
    os.environ.update(TB_HIDDEN_SECRET="s3cr3t", TB_SHOWN_SETTING="on")
    try:
        config = make_config(root, load_models=["all"], blacklist_env_vars="TB_HIDDEN_.*")
        live = LiveServer(config).start()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        yield live
    finally:
        live.stop()


def _seen(server: LiveServer) -> dict:
    r = httpx.post(f"{server.url}/predictions/envs", content=b"x", timeout=60)
    assert r.status_code == 200, r.text
    return json.loads(r.text)


def _scale(server: LiveServer, workers: int) -> None:
    url = f"{server.management_url}/models/envs?min_worker={workers}&synchronous=true"
    assert httpx.put(url, timeout=120).status_code == 200


def test_the_handler_does_not_see_a_blacklisted_variable(server: LiveServer) -> None:
    """Not in its os.environ, nor in the environment its process started with, whether it was
    spawned or forked from the fork server (whose environment a forked worker's /proc shows).
    Was: the key was noted as ignored and every worker saw the whole environment."""
    hidden = {"TB_HIDDEN_SECRET": None, "TB_SHOWN_SETTING": "on", "proc": False}
    assert _seen(server) == {**hidden, "proc_shown": True}
    forks = server.server.forks
    assert forks is not None and forks.wait_ready(120)
    _scale(server, 0)
    _scale(server, 1)  # the template is up: this worker forks from it
    assert forks.forks >= 1
    assert _seen(server) == {**hidden, "proc_shown": True}


def test_a_regex_that_does_not_compile_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="blacklist_env_vars: bad regex"):
        make_config(tmp_path, blacklist_env_vars="(")


def test_a_worker_started_before_the_configuration_drops_them_at_load(monkeypatch) -> None:
    """A worker the CLI spawned early has the whole environment: its Load hides them."""
    from torchbay.handlers.runtime.loading import hide_environment

    monkeypatch.setenv("TB_HIDDEN_KEY", "x")
    monkeypatch.setenv("TB_HIDDEN_KEYRING", "y")
    monkeypatch.setenv("XTB_HIDDEN_KEY", "z")
    hide_environment("TB_HIDDEN_KEY")  # whole names, as Java's Matcher.matches
    assert "TB_HIDDEN_KEY" not in os.environ
    assert os.environ["TB_HIDDEN_KEYRING"] == "y" and os.environ["XTB_HIDDEN_KEY"] == "z"
