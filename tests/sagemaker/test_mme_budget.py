"""End to end: the SageMaker PyTorch toolkit (2.0.25) in multi-model mode
(``SAGEMAKER_MULTI_MODEL=true``) starts torchbay with its own start code and configuration, and
SageMaker's calls load, invoke and unload models in SageMaker's layout through the toolkit's
handler service, with a budget of one loaded model (``TORCHBAY_MAX_LOADED_MODELS=1``).

SageMaker loads a model on an instance when an invocation for it arrives and counts it loaded
until it unloads it; torchbay keeps every model SageMaker loaded registered and holds at most
the budget's worth in memory: a second model past the budget is registered unloaded, loads on
its first invocation, and the least recently used idle one is unloaded for it (its memory
freed, its registration kept, so SageMaker's view holds). The toolkit's file leaves the model
API off (its run-on line, tests/data/torchserve/sagemaker_mme/README.md), so the container
turns it on with ``TS_ENABLE_MODEL_API=true``, as a TorchServe container must.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.sagemaker.helpers import INPUT, make_model_dir
from tests.sagemaker.test_toolkit_serving import kill_family, servers, start_toolkit


def wait_healthy(base: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the toolkit exited ({proc.returncode}): {log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/ping", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    pytest.fail(f"the toolkit's server never answered /ping: {log.read_text()[-3000:]}")


def describe(base: str, name: str) -> dict:
    response = httpx.get(f"{base}/models/{name}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()[0]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_toolkit_in_multi_model_mode_serves_more_models_than_the_budget_holds(
    tmp_path: Path,
) -> None:
    dirs = {
        "a": make_model_dir(tmp_path / "models" / "hash-a" / "model"),
        "b": make_model_dir(tmp_path / "models" / "hash-b" / "model", scale=10.0),
    }
    answers = {"a": {"scores": [[14.5, 31.5]]}, "b": {"scores": [[145.0, 315.0]]}}
    proc, port, log = start_toolkit(
        tmp_path,
        SAGEMAKER_MULTI_MODEL="true",
        TS_ENABLE_MODEL_API="true",
        TORCHBAY_MAX_LOADED_MODELS="1",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, log)
        for name, folder in dirs.items():  # SageMaker's load call, one model after the other
            body = {"model_name": name, "url": str(folder)}
            loaded = httpx.post(f"{base}/models", json=body, timeout=240)
            assert loaded.status_code == 200, loaded.text
        again = httpx.post(
            f"{base}/models", json={"model_name": "a", "url": str(dirs["a"])}, timeout=60
        )
        assert again.status_code == 409  # SageMaker's "already loaded"
        assert (describe(base, "a")["loaded"], describe(base, "b")["loaded"]) == (True, False)

        def invoke(name: str) -> None:
            response = httpx.post(f"{base}/models/{name}/invoke", json=INPUT, timeout=240)
            assert (response.status_code, response.json()) == (200, answers[name])

        invoke("b")  # past the budget: loads now, a (idle) is unloaded for it
        a, b = describe(base, "a"), describe(base, "b")
        assert (a["loaded"], a["evictions"], b["loaded"], b["loads"]) == (False, 1, True, 1)
        invoke("a")  # and back
        assert (describe(base, "a")["loads"], describe(base, "b")["loaded"]) == (2, False)
        listed = httpx.get(f"{base}/models").json()["models"]
        assert [m["modelName"] for m in listed] == ["a", "b"]  # SageMaker's view: both loaded

        assert (
            httpx.delete(f"{base}/models/b", timeout=120).status_code == 200
        )  # SageMaker's unload
        missing = httpx.post(f"{base}/models/b/invoke", json=INPUT)
        assert missing.status_code == 404  # unknown to SageMaker's contract now
        assert [m["modelName"] for m in httpx.get(f"{base}/models").json()["models"]] == ["a"]
        server = servers(tmp_path)
        assert len(server) == 1
        proc.send_signal(signal.SIGTERM)  # the toolkit passes it on to the server
        assert proc.wait(180) == 0
    finally:
        kill_family(proc)
        for leftover in servers(tmp_path):
            leftover.kill()
