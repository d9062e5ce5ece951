"""The management API's finer points on a live server, over REST and gRPC, where torchbay once
answered otherwise than TorchServe 0.12 (its answers: tests/data/torchserve_0.12/versions, the
whole sequence compared by test_torchserve_versions.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest

from tests.server.conftest import (
    ASSETS,
    LiveServer,
    build_store,
    make_config,
    running,
    tiny_archive,
    until,
)

HANDLER = Path(__file__).resolve().parents[1] / "data" / "torchserve_0.12" / "parity_handler.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    store = tmp_path_factory.mktemp("finer-store")
    work = tmp_path_factory.mktemp("finer-build")
    shutil.move(tiny_archive(work, work / "out", "tiny", str(HANDLER)), store / "tiny.mar")
    live = LiveServer(make_config(store, enable_model_api=True)).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{live.server.state.ports.grpc_management}")
    try:
        with httpx.Client(base_url=live.management_url, timeout=120) as http:
            yield SimpleNamespace(http=http, channel=channel)
    finally:
        channel.close()
        live.stop()


def _describe(server: SimpleNamespace, name: str) -> dict[str, Any]:
    response = server.http.get(f"/models/{name}")
    assert response.status_code == 200, response.text
    return response.json()[0]


def _register(server: SimpleNamespace, name: str, **params: Any) -> None:
    params = {"url": "tiny.mar", "model_name": name, **params}
    response = server.http.post("/models", params=params)
    assert response.status_code == 200, response.text


def test_describe_shows_whole_numbers_as_integers(server: SimpleNamespace) -> None:
    """TorchServe describes ``"maxBatchDelay": 100``; torchbay said ``100.0`` (its settings take
    decimals), which a client decoding into an integer field (Go, serde) refuses."""
    _register(server, "whole")
    _register(server, "decimal", max_batch_delay="2.5")
    whole, decimal = _describe(server, "whole"), _describe(server, "decimal")
    for key, value in {
        "batchSize": 1, "maxBatchDelay": 100, "responseTimeout": 120, "startupTimeout": 120,
        "maxRetryTimeoutInSec": 300, "clientTimeoutInMills": 0, "minWorkers": 0,
    }.items():  # fmt: skip
        assert (key, whole[key], type(whole[key])) == (key, value, int)
    assert '"maxBatchDelay":100,' in server.http.get("/models/whole").text.replace(" ", "")
    assert decimal["maxBatchDelay"] == 2.5  # a decimal one stays what was asked


def test_describe_shows_the_runtime_registered(server: SimpleNamespace) -> None:
    """``runtime=python3`` at registration: TorchServe describes ``"runtime": "python3"``;
    torchbay always said ``python``. Without it: the archive's (``python``)."""
    _register(server, "rt3", runtime="python3")
    _register(server, "rt")
    assert _describe(server, "rt3")["runtime"] == "python3"
    assert _describe(server, "rt")["runtime"] == "python"


def _rpc(server: SimpleNamespace, ts: SimpleNamespace, rpc: str, **fields: Any) -> str:
    stub = ts.management_pb2_grpc.ManagementAPIsServiceStub(server.channel)
    request = getattr(ts.management_pb2, f"{rpc}Request")(**fields)
    return getattr(stub, rpc)(request, timeout=120).msg


def test_grpc_management_answers_the_status_message(
    server: SimpleNamespace, ts_stubs: SimpleNamespace
) -> None:
    """TorchServe's ManagementAPIsService answers register, scale, set-default and unregister
    with the status message alone in ``msg``; torchbay sent the HTTP body, ``{"status": ...}``.
    Describe and list stay JSON text."""
    registered = _rpc(server, ts_stubs, "RegisterModel", url="tiny.mar", model_name="g1")
    assert registered == (
        'Model "g1" Version: 1.0 registered with 0 initial workers. '
        "Use scale workers API to add workers for the model."
    )
    scaled = _rpc(server, ts_stubs, "ScaleWorker", model_name="g1", min_worker=1, synchronous=True)
    assert scaled == "Workers scaled to 1 for model: g1"
    default = _rpc(server, ts_stubs, "SetDefault", model_name="g1", model_version="1.0")
    assert default == 'Default version successfully updated for model "g1" to "1.0"'
    described = json.loads(_rpc(server, ts_stubs, "DescribeModel", model_name="g1"))
    assert described[0]["modelName"] == "g1"
    assert _rpc(server, ts_stubs, "UnregisterModel", model_name="g1") == 'Model "g1" unregistered'


def test_grpc_zero_or_negative_numbers_are_defaults(
    server: SimpleNamespace, ts_stubs: SimpleNamespace
) -> None:
    """TorchServe's gRPC API takes a number below 1 as not given (``getRegisterParam``): a
    register with -1 everywhere is the defaults, a scale with ``min_worker`` -1 is 1, with
    ``max_worker`` or ``timeout`` -1 the defaults. torchbay refused each (INVALID_ARGUMENT)."""
    negatives = dict.fromkeys(
        ("initial_workers", "batch_size", "max_batch_delay", "response_timeout",
         "startup_timeout"), -1,
    )  # fmt: skip
    _rpc(server, ts_stubs, "RegisterModel", url="tiny.mar", model_name="neg", **negatives)
    described = _describe(server, "neg")
    assert {k: described[k] for k in ("minWorkers", "batchSize", "maxBatchDelay")} == {
        "minWorkers": 0, "batchSize": 1, "maxBatchDelay": 100,
    }  # fmt: skip
    assert (described["responseTimeout"], described["startupTimeout"]) == (120, 120)
    for fields in ({"min_worker": -1}, {"min_worker": 1, "max_worker": -1}, {"timeout": -5}):
        scaled = _rpc(server, ts_stubs, "ScaleWorker", model_name="neg", synchronous=True, **fields)
        assert scaled == "Workers scaled to 1 for model: neg"
    assert _describe(server, "neg")["maxWorkers"] == 1


def test_repeated_query_parameters_take_the_first_value(server: SimpleNamespace) -> None:
    """TorchServe reads a parameter's first value (``?min_worker=1&min_worker=2`` scales to
    1); torchbay read the last one, for register, scale and list alike."""
    registered = server.http.post(
        "/models", params=[("url", "tiny.mar"), ("model_name", "first"), ("model_name", "second")]
    )
    assert registered.status_code == 200, registered.text
    assert _describe(server, "first")["modelName"] == "first"
    assert server.http.get("/models/second").status_code == 404
    scaled = server.http.put(
        "/models/first",
        params=[("min_worker", "1"), ("min_worker", "2"), ("synchronous", "true")],
    )
    assert scaled.json() == {"status": "Workers scaled to 1 for model: first"}
    assert _describe(server, "first")["minWorkers"] == 1
    listed = server.http.get("/models", params=[("limit", "1"), ("limit", "2")]).json()
    assert (len(listed["models"]), listed["nextPageToken"]) == (1, "1")


def test_scale_timeout_below_minus_one_is_taken(server: SimpleNamespace) -> None:
    """TorchServe scales with ``timeout=-2`` (200); torchbay answered 400."""
    _register(server, "drain")
    params = {"min_worker": "1", "synchronous": "true", "timeout": "-2"}
    scaled = server.http.put("/models/drain", params=params)
    assert (scaled.status_code, scaled.json()) == (
        200,
        {"status": "Workers scaled to 1 for model: drain"},
    )
    too_long = server.http.put("/models/drain", params={**params, "timeout": "604801"})
    assert too_long.status_code == 400  # past torchbay's bound, as the README's table says


def test_list_token_past_java_int_is_the_first_page(server: SimpleNamespace) -> None:
    """TorchServe parses ``next_page_token`` as a Java int: 99999999999 is junk, the first
    page; torchbay answered an empty page."""
    first = server.http.get("/models").json()
    assert first["models"]
    assert server.http.get("/models", params={"next_page_token": "99999999999"}).json() == first


def test_customized_describe_asks_the_handler(
    server: SimpleNamespace, ts_stubs: SimpleNamespace
) -> None:
    """``?customized=true`` (gRPC ``customized``): TorchServe adds what the handler answers a
    ``describe: True`` request as ``customizedMetadata`` (the parity handler's ``{"ok": true}``),
    and answers 503 without a worker; torchbay ignored the parameter."""
    _register(server, "cust", initial_workers="1")
    answer = server.http.get("/models/cust", params={"customized": "true"})
    assert answer.json()[0]["customizedMetadata"] == {"ok": True}
    described = _rpc(server, ts_stubs, "DescribeModel", model_name="cust", customized=True)
    assert json.loads(described)[0]["customizedMetadata"] == {"ok": True}
    every = server.http.get("/models/cust/all", params={"customized": "true"}).json()
    assert "customizedMetadata" not in every[0]  # TorchServe: never for "all"
    _register(server, "idle")
    idle = server.http.get("/models/idle/1.0", params={"customized": "true"})
    assert (idle.status_code, idle.json()["message"]) == (
        503,
        'Model "idle" has no worker to serve describe request. '
        "Please use scale workers API to add workers.",
    )


def test_register_json_whole_numbers_written_as_decimals(server: SimpleNamespace) -> None:
    """A JSON body's ``"batch_size": 4.0``: TorchServe (Gson) registers batch size 4; torchbay
    took it as junk (batch size 1). ``4.5`` or ``"abc"``: TorchServe refuses the request (500
    JsonSyntaxException), torchbay registered batch size 1; now a 400 that names it."""
    body = {"url": "tiny.mar", "model_name": "jf", "batch_size": 4.0, "initial_workers": 0.0}
    registered = server.http.post("/models", json=body)
    assert registered.status_code == 200, registered.text
    assert _describe(server, "jf")["batchSize"] == 4
    for junk in (4.5, "abc", [4]):
        body = {"url": "tiny.mar", "model_name": "jh", "batch_size": junk}
        refused = server.http.post("/models", json=body)
        assert refused.status_code == 400, refused.text
        assert refused.json()["message"].startswith("Invalid parameter(s): batch_size: ")
    assert server.http.get("/models/jh").status_code == 404
    stringly = {"url": "tiny.mar", "model_name": "js", "batch_size": "4"}
    assert server.http.post("/models", json=stringly).status_code == 200
    assert _describe(server, "js")["batchSize"] == 4


def test_options_on_a_model_answers_its_management_api(server: SimpleNamespace) -> None:
    """TorchServe 0.12 answers ``OPTIONS /models/{m}[/{v}]`` (ManagementRequestHandler's
    OPTIONS branch, OpenApiUtils.getModelManagementApi) 200 with the management API's
    description for that model, titled ``RESTful Management API for: m``, and 404 for a model
    it lacks; torchbay answered 405 (its inference port answers ``OPTIONS /predictions/{m}``)."""
    _register(server, "opt")
    for path in ("/models/opt", "/models/opt/1.0"):
        answer = server.http.request("OPTIONS", path)
        assert answer.status_code == 200, answer.text
        document = answer.json()
        assert document["info"]["title"] == "RESTful Management API for: opt"
        assert {"get", "put", "delete"} <= set(document["paths"]["/models/opt"])
        assert "put" in document["paths"]["/models/opt/{version}/set-default"]
        assert all("opt" in p for p in document["paths"])  # that model's operations only
    for path, message in (
        ("/models/nope", "Model not found: nope"),
        ("/models/opt/9.9", "Model version: 9.9 does not exist for model: opt"),
    ):
        missing = server.http.request("OPTIONS", path)
        assert (missing.status_code, missing.json()["message"]) == (404, message)


def test_an_asynchronous_registration_that_cannot_load_stays_registered(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """TorchServe 0.12 keeps a version registered asynchronously (202) whose worker cannot load
    (no onError runs without ``synchronous``): listed and described, its worker retrying, until
    unregistered. torchbay forgot it: a 404 for the client that was told 202, nothing to
    describe or unregister, while the config snapshot written at the 202 still held it. Now it
    stays, FAILED with its load error, answers 503, and scales or unregisters as any version."""
    yaml = tmp_path / "failing.yaml"
    yaml.write_text("loadFails: true\n")
    handler = {"failing": str(ASSETS / "load_gate_handler.py")}
    store = build_store(tmp_path_factory, "failing-store", handler, {"failing": yaml})
    with running(store, enable_model_api=True) as live:
        http = httpx.Client(base_url=live.management_url, timeout=120)
        params = {"url": "failing.mar", "initial_workers": "1", "synchronous": "false"}
        assert http.post("/models", params=params).status_code == 202

        def settled() -> bool:
            answer = http.get("/models/failing")
            return answer.status_code != 200 or answer.json()[0]["status"] != "LOADING"

        until(settled, "the asynchronous load's end")
        described = http.get("/models/failing")
        assert described.status_code == 200, described.text
        assert described.json()[0]["status"] == "FAILED"
        assert "fails to load on purpose" in described.json()[0]["loadError"]
        assert http.get("/models").json()["models"][0]["modelName"] == "failing"
        predicted = httpx.post(f"{live.url}/predictions/failing", json={"id": "a"}, timeout=60)
        assert predicted.status_code == 503, predicted.text
        scaled = http.put("/models/failing", params={"min_worker": "1", "synchronous": "true"})
        assert scaled.status_code == 500, scaled.text  # it still cannot load: TorchServe's 500
        assert http.delete("/models/failing").json() == {"status": 'Model "failing" unregistered'}
        assert http.get("/models").json()["models"] == []
        http.close()
