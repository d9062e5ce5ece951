"""Triton's statistics, model repository and model configuration extensions on a real server,
over httpx and tritonclient.http on their defaults: counts and durations after real requests
(failures in ``fail``), index / load / unload (config overrides, unsupported ones, unknown
models), the disabled model API (405, OIP shape) and token authorization."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from .conftest import LiveServer, running

pytestmark = pytest.mark.slow

ZEROS = bytes(256)  # 64 float32 zeros: one row for the tensor handler


@pytest.fixture(scope="module")
def server(oip_store: Path) -> Iterator[LiveServer]:
    with running(oip_store, load_models=["one.mar"], enable_model_api=True) as live:
        yield live


@pytest.fixture
def client(server: LiveServer):
    c = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.close()


def _stats_of(body: dict, name: str) -> dict:
    (entry,) = [s for s in body["model_stats"] if s["name"] == name]
    return entry


def test_statistics_count_successes_failures_and_times(server: LiveServer, client) -> None:
    url = server.url
    before = _stats_of(httpx.get(f"{url}/v2/models/one/stats").json(), "one")
    for _ in range(3):
        ok = httpx.post(f"{url}/predictions/one", content=ZEROS)
        assert ok.status_code == 200, ok.text
    v2 = {"inputs": [{"name": "input0", "shape": [1, 64], "datatype": "FP32",
                      "data": [0.0] * 64}]}  # fmt: skip
    assert httpx.post(f"{url}/v2/models/one/infer", json=v2).status_code == 200
    bad = httpx.post(f"{url}/predictions/one", content=b"\x00" * 7)  # not whole float32s
    assert 400 <= bad.status_code < 500, bad.text

    after = _stats_of(httpx.get(f"{url}/v2/models/one/stats").json(), "one")
    assert after["version"] == "1.0"
    inf, old = after["inference_stats"], before["inference_stats"]
    assert inf["success"]["count"] - old["success"]["count"] == 4
    assert inf["fail"]["count"] - old["fail"]["count"] == 1
    assert inf["success"]["ns"] > old["success"]["ns"] and inf["fail"]["ns"] > 0
    # Triton's queue counts successes only (UpdateFailure: the fail count and time alone).
    assert inf["queue"]["count"] - old["queue"]["count"] == 4 and inf["queue"]["ns"] > 0
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] >= 4  # batch_size 1
    # Compute times are a successful request's (Triton's UpdateSuccess): the 400 has none.
    assert inf["compute_infer"]["count"] - old["compute_infer"]["count"] == 4
    assert inf["compute_infer"]["ns"] > 0
    assert after["last_inference"] > 0
    assert after["batch_stats"][0]["batch_size"] == 1
    assert after["batch_stats"][0]["compute_infer"]["count"] >= 4

    # tritonclient, every URL form.
    counted = _stats_of(client.get_inference_statistics("one"), "one")["inference_count"]
    assert counted == before["inference_count"] + 4
    assert client.get_inference_statistics("one", "1.0")["model_stats"][0]["name"] == "one"
    assert "one" in [s["name"] for s in client.get_inference_statistics()["model_stats"]]
    missing = httpx.get(f"{url}/v2/models/nope/stats")
    assert missing.status_code == 404 and set(missing.json()) == {"error"}


def test_model_config(server: LiveServer, client) -> None:
    config = client.get_model_config("one")
    assert config["name"] == "one" and config["max_batch_size"] == 1
    assert config["input"] == [{"name": "input0", "data_type": "TYPE_FP32", "dims": [64]}]
    assert config["output"] == [{"name": "output0", "data_type": "TYPE_FP32", "dims": [10]}]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100_000
    assert config["instance_group"][0]["count"] == 1
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert httpx.get(f"{server.url}/v2/models/one/versions/1.0/config").json() == config


def test_repository_index_load_and_unload(server: LiveServer, client) -> None:
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["one"] == {"name": "one", "version": "1.0", "state": "READY", "reason": ""}
    assert index["two"]["state"] == "UNAVAILABLE" and index["two"]["reason"] == "unloaded"
    ready = httpx.post(f"{server.url}/v2/repository/index", json={"ready": True}).json()
    assert [e["name"] for e in ready] == ["one"]

    config = {"max_batch_size": 4, "dynamic_batching": {"max_queue_delay_microseconds": 2000},
              "instance_group": [{"count": 1}]}  # fmt: skip
    client.load_model("two", config=json.dumps(config))
    assert client.is_model_ready("two")
    loaded = client.get_model_config("two")
    assert loaded["max_batch_size"] == 4
    assert loaded["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert [i["name"] for i in loaded["input"]] == ["features", "extra"]
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["two"]["state"] == "READY"
    client.load_model("two")  # loaded already, no new config: nothing to do

    client.unload_model("two")
    assert "two" not in server.server.registry.models
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["two"]["state"] == "UNAVAILABLE"


@pytest.mark.parametrize(
    ("name", "body", "status", "fragment"),
    [
        ("nope", {}, 404, "not in the model store"),
        # Was 200 (an empty list or string taken for no parameters): Triton's is a 400.
        ("two", {"parameters": []}, 400, '"parameters" must be an object'),
        ("two", {"parameters": ""}, 400, '"parameters" must be an object'),
        ("two", {"parameters": {"config": json.dumps({"backend": "onnx"})}}, 400, "backend"),
        ("two", {"parameters": {"file:1/model.onnx": "AAAA"}}, 400, "file:1/model.onnx"),
        ("two", {"parameters": {"config": "{not json"}}, 400, "JSON"),
        ("two", {"parameters": {"config": json.dumps({"max_batch_size": 0.5e9})}}, 400,
         "batch_size"),
        ("two", {"parameters": {"config": '{"max_batch_size": Infinity}'}}, 400, "numbers"),
        ("two", {"parameters": {"config": '{"instance_group": [{"count": Infinity}]}'}}, 400,
         "numbers"),
        ("two", {"parameters": {"config": '{"max_batch_size": -5}'}}, 400,
         "'max_batch_size' must be non-negative value for two"),
        ("two", {"parameters": {"config": '{"max_batch_size": 2.5}'}}, 400, "whole numbers"),
        ("two", {"parameters": {"config": '{"max_batch_size": true}'}}, 400, "whole numbers"),
        ("two", {"parameters": {"config": '{"instance_group": [{"count": 1.5}]}'}}, 400,
         "whole numbers"),
        ("two", {"parameters": {"config": json.dumps({"dynamic_batching": {
            "max_queue_delay_microseconds": 0.5}})}}, 400, "whole numbers"),
        # what a load does not apply is refused, not ignored (it answered 200, unchanged)
        ("two", {"parameters": {"config": json.dumps({"dynamic_batching": {
            "max_queue_delay_microseconds": 100, "priority_levels": 3}})}}, 400,
         "dynamic_batching cannot change"),
        ("two", {"parameters": {"config": json.dumps({"dynamic_batching": {
            "preferred_batch_size": [4]}})}}, 400, "max_queue_delay_microseconds alone"),
        ("two", {"parameters": {"config": json.dumps({"dynamic_batching": {
            "default_queue_policy": {"max_queue_size": 5}}})}}, 400, "dynamic_batching"),
        ("two", {"parameters": {"config": json.dumps({"instance_group": [
            {"count": 1, "gpus": [0]}]})}}, 400, "instance_group cannot change"),
        ("two", {"parameters": {"config": json.dumps({"instance_group": [
            {"count": 1, "kind": "KIND_MODEL"}]})}}, 400, "the kind is the server's devices'"),
    ],
)  # fmt: skip
def test_load_refusals(server: LiveServer, name: str, body: dict, status: int, fragment) -> None:
    response = httpx.post(f"{server.url}/v2/repository/models/{name}/load", json=body)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and fragment in response.json()["error"]
    assert "two" not in server.server.registry.models


def test_loading_a_loaded_model_with_a_config_reloads_it_with_that_config(
    server: LiveServer, client
) -> None:
    """As Triton: the new config takes effect (here as a live change, so it serves throughout);
    the model stays READY and answers."""
    assert client.get_model_config("one")["max_batch_size"] == 1
    config = {
        "max_batch_size": 3,
        "dynamic_batching": {"max_queue_delay_microseconds": 1500},
        "instance_group": [{"count": 2}],
    }
    client.load_model("one", config=json.dumps(config))
    try:
        loaded = client.get_model_config("one")
        assert loaded["max_batch_size"] == 3
        assert loaded["dynamic_batching"]["max_queue_delay_microseconds"] == 1500
        assert loaded["instance_group"][0]["count"] == 2
        assert len(server.server.registry.resolve("one").slots) == 2
        assert client.is_model_ready("one")
        ok = httpx.post(f"{server.url}/predictions/one", content=ZEROS, timeout=60)
        assert ok.status_code == 200, ok.text
    finally:
        back = {
            "max_batch_size": 1,
            "instance_group": [{"count": 1}],
            "dynamic_batching": {"max_queue_delay_microseconds": 100000},
        }
        client.load_model("one", config=json.dumps(back))
    assert client.get_model_config("one")["max_batch_size"] == 1


def test_a_load_takes_back_the_config_the_server_gave(server: LiveServer, client) -> None:
    """Triton loads a whole config, so its users send back what get_model_config gave with a
    field changed (over HTTP, or gRPC's JSON with int64 dims as text); its platform, backend,
    version policy, inputs and outputs were each an "unsupported field" 400. They are taken as
    they are; a changed one is refused before anything changes (a model not loaded yet is
    checked once loaded, and left unloaded)."""
    grpc_client = triton_grpc.InferenceServerClient(
        f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    )
    served = client.get_model_config("one")
    try:
        client.load_model("one", config=json.dumps({**served, "max_batch_size": 2}))
        assert client.get_model_config("one")["max_batch_size"] == 2
        over_grpc = grpc_client.get_model_config("one", as_json=True)["config"]
        grpc_client.load_model("one", config=json.dumps({**over_grpc, "max_batch_size": "3"}))
        assert client.get_model_config("one")["max_batch_size"] == 3
        changed = {**served, "input": [{**served["input"][0], "dims": [65]}]}
        with pytest.raises(InferenceServerException, match="input cannot change"):
            client.load_model("one", config=json.dumps(changed))
        assert client.get_model_config("one")["max_batch_size"] == 3
    finally:
        client.load_model("one", config=json.dumps(served))
        grpc_client.close()
    assert client.get_model_config("one")["max_batch_size"] == served["max_batch_size"]
    with pytest.raises(InferenceServerException, match="platform cannot change"):
        client.load_model("two", config=json.dumps({"platform": "onnxruntime_onnx"}))
    assert "two" not in server.server.registry.models


@pytest.mark.parametrize("groups", [[{"count": 0}], [{"count": -2, "kind": "KIND_AUTO"}], []])
def test_load_with_an_instance_count_below_one_takes_one(
    server: LiveServer, client, groups: list
) -> None:
    """Triton gives a group whose count is below 1 (or no group at all) its default count,
    one instance for PyTorch; torchbay registered the model with no worker."""
    client.load_model("two", config=json.dumps({"instance_group": groups}))
    try:
        assert client.is_model_ready("two")
        assert client.get_model_config("two")["instance_group"][0]["count"] == 1
        assert len(server.server.registry.resolve("two").slots) == 1
    finally:
        client.unload_model("two")


def test_loading_a_loaded_model_whose_archive_was_replaced_reloads_it(tmp_path: Path) -> None:
    """As Triton: a load request reloads a model whose files changed (here the archive, replaced
    by one with another handler); unchanged, the load leaves it as it is."""
    from .conftest import ASSETS, tiny_archive

    store, work = tmp_path / "store", tmp_path / "work"
    store.mkdir(), work.mkdir()
    tiny_archive(work, store, "swap", str(ASSETS / "probe_handler.py"))
    with running(store, load_models=["swap.mar"], enable_model_api=True) as live:
        client = triton_http.InferenceServerClient(live.url.removeprefix("http://"))

        def answer() -> object:
            response = httpx.post(f"{live.url}/predictions/swap", json={"x": 1}, timeout=60)
            assert response.status_code == 200, response.text
            return response.json()

        first = live.server.registry.resolve("swap")
        probe = answer()
        client.load_model("swap")  # unchanged: nothing to do
        assert live.server.registry.resolve("swap") is first
        replaced = tiny_archive(work, work, "swap", str(ASSETS / "metric_handler.py"))
        replaced.replace(store / "swap.mar")
        client.load_model("swap")
        assert live.server.registry.resolve("swap") is not first
        assert client.is_model_ready("swap")
        assert answer() == {"batch": 1} != probe  # the new archive's handler answers
        client.close()


def test_loading_a_model_held_at_zero_workers_starts_it(server: LiveServer, client) -> None:
    """As Triton loads a model that is not ready: one scaled to zero (or registered with no
    worker) gets a worker; the load answered 200 and left it answering 503."""
    scale = f"{server.management_url}/models/one?synchronous=true&min_worker="
    assert httpx.put(scale + "0", timeout=60).status_code == 200
    try:
        assert not client.is_model_ready("one")
        client.load_model("one")
        assert client.is_model_ready("one")
        answer = httpx.post(f"{server.url}/predictions/one", content=ZEROS, timeout=60)
        assert answer.status_code == 200, answer.text
    finally:
        assert httpx.put(scale + "1", timeout=60).status_code == 200


def test_loads_and_unloads_of_a_model_take_turns(tmp_path_factory, tmp_path: Path) -> None:
    """As Triton's repository manager: a load that comes while the model's load is under way
    waits for it (was answered 200 before the model was ready, or 409 'already registered'
    when both came before either registered), and so does an unload (it unregistered the model
    mid-load: the load answered 503; or, before the registration, 404 with the model left
    loaded)."""
    from .conftest import load_gated_store, until

    gate = tmp_path / "gate"
    store, started = load_gated_store(tmp_path_factory, tmp_path, "turns", gate=gate)
    with running(store, enable_model_api=True) as live, ThreadPoolExecutor(2) as pool:
        url = f"{live.url}/v2/repository/models/gated"

        def under_way(second: str) -> tuple[Future, Future]:
            first = pool.submit(httpx.post, f"{url}/load", json={}, timeout=120)
            until(started.exists, "the load under way")
            then = pool.submit(httpx.post, f"{url}/{second}", json={}, timeout=120)
            wait([then], timeout=1.0)  # before: answered at once
            assert not then.done(), then.result().text  # it waits for the load under way
            gate.touch()
            return first, then

        for answer in under_way("load"):
            assert answer.result().status_code == 200, answer.result().text
        assert list(live.server.registry.models["gated"]) == ["1.0"]
        assert httpx.post(f"{url}/unload", json={}, timeout=120).status_code == 200
        gate.unlink(), started.unlink()
        for answer in under_way("unload"):
            assert answer.result().status_code == 200, answer.result().text
        assert "gated" not in live.server.registry.models
        assert live.server.plane.models._turns == {}  # nothing kept per name


@pytest.mark.parametrize("verb", ["load", "unload"])
def test_a_failed_start_up_model_loaded_or_unloaded_later_makes_the_server_ready(
    tmp_path_factory, tmp_path: Path, verb: str
) -> None:
    """Triton's strict readiness reads a model's state now: a start-up model that failed, then
    loaded (or unloaded: forgotten, where it was a 404) through the repository, no longer holds
    the server not ready (it did for good, the readiness probe failing while every model
    served)."""
    from .conftest import ASSETS, build_store

    flag = tmp_path / "fail"
    flag.touch()
    (tmp_path / "flaky.yaml").write_text(f"loadFailsOnceExists: {flag}\n")
    handler = {"flaky": str(ASSETS / "load_gate_handler.py")}
    store = build_store(tmp_path_factory, "flaky", handler, {"flaky": tmp_path / "flaky.yaml"})
    with running(store, load_models=["flaky.mar"], enable_model_api=True) as live:
        assert "flaky.mar" in live.server.state.failed_models
        assert httpx.get(f"{live.url}/v2/health/ready").status_code == 503
        # Was 200 Healthy: TorchServe 0.12 answers 500 Unhealthy once a model's workers have
        # failed past their retry window (tests/data/torchserve/ping).
        ping = httpx.get(f"{live.url}/ping", timeout=30)
        assert (ping.status_code, ping.json()) == (500, {"status": "Unhealthy"})
        index = httpx.post(f"{live.url}/v2/repository/index", json={}, timeout=30).json()
        # Was "unloaded", as if nothing had tried: Triton's index gives the load's error.
        [(state, reason)] = [(e["state"], e["reason"]) for e in index if e["name"] == "flaky"]
        assert state == "UNAVAILABLE" and "fails to load again on purpose" in reason, reason
        if verb == "load":
            flag.unlink()
        done = httpx.post(f"{live.url}/v2/repository/models/flaky/{verb}", json={}, timeout=120)
        assert done.status_code == 200, done.text
        assert httpx.get(f"{live.url}/v2/health/ready").json() == {"ready": True}
        assert httpx.get(f"{live.url}/ping", timeout=30).json() == {"status": "Healthy"}
        assert ("flaky" in live.server.registry.models) is (verb == "load")
        index = httpx.post(f"{live.url}/v2/repository/index", json={}, timeout=30).json()
        [entry] = [(e["state"], e["reason"]) for e in index if e["name"] == "flaky"]
        assert entry == (("READY", "") if verb == "load" else ("UNAVAILABLE", "unloaded"))


def test_unload_unknown_model_is_404(server: LiveServer, client) -> None:
    with pytest.raises(InferenceServerException, match="Model not found: nope"):
        client.unload_model("nope")
    # Was 200 (an empty list taken for no parameters): Triton's is a 400.
    url = f"{server.url}/v2/repository/models/two/unload"
    refused = httpx.post(url, json={"parameters": []})
    assert refused.status_code == 400 and "must be an object" in refused.json()["error"]


def test_unloading_a_model_that_is_not_loaded_succeeds(server: LiveServer, client) -> None:
    """Triton: "Unloading a model that is not loaded on server has no affect and success code
    will be returned" (tritonserver.h), so a second unload, or a clean-up that unloads a
    model of the repository never loaded, succeeds; it was a 404 "Model not found"."""
    grpc_client = triton_grpc.InferenceServerClient(
        f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    )
    if "two" in server.server.registry.models:
        client.unload_model("two")
    for _ in range(2):
        client.unload_model("two")
        grpc_client.unload_model("two", unload_dependents=True)
    grpc_client.close()
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["two"]["state"] == "UNAVAILABLE" and index["one"]["state"] == "READY"


def test_disabled_model_api_and_token_auth(oip_store: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key_file.json"
    with running(
        oip_store, load_models=["one.mar"], disable_token_authorization=False, key_file=key_file
    ) as live:
        keys = json.loads(key_file.read_text())
        mgmt = {"Authorization": f"Bearer {keys['management']['key']}"}
        inference = {"Authorization": f"Bearer {keys['inference']['key']}"}
        url = live.url
        for path in ("/v2/repository/index", "/v2/repository/models/two/load"):
            assert httpx.post(url + path).status_code == 401
            assert httpx.post(url + path, headers=inference).status_code == 401
        # The management key reads the index; load and unload need the model API: 405.
        assert httpx.post(f"{url}/v2/repository/index", headers=mgmt).status_code == 200
        for verb in ("load", "unload"):
            refused = httpx.post(f"{url}/v2/repository/models/one/{verb}", headers=mgmt)
            assert refused.status_code == 405
            assert (
                set(refused.json()) == {"error"} and "enable-model-api" in refused.json()["error"]
            )
        assert "one" in live.server.registry.models
        # Statistics and the model config take the inference key.
        assert httpx.get(f"{url}/v2/models/stats").status_code == 401
        assert httpx.get(f"{url}/v2/models/stats", headers=inference).status_code == 200
        assert httpx.get(f"{url}/v2/models/one/config", headers=inference).status_code == 200
        client = triton_http.InferenceServerClient(url.removeprefix("http://"))
        try:
            with pytest.raises(InferenceServerException, match="disabled"):
                client.load_model("two", headers=mgmt)
        finally:
            client.close()
