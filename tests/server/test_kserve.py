"""KServe on torchbay: the v1 predict envelope, ``model_snapshot`` and the shared
inference/management listener (the rest of the KServe layout runs in tests/deploy)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchbay.archiver.package import ArchiveOptions, package
from torchbay.server.config.settings import ServerConfig
from torchbay.server.config.sources import load_server_config
from torchbay.server.errors import BadRequest, ConfigError
from torchbay.server.http.combined import is_management_path, same_address
from torchbay.server.http.listeners import listener_names

from .conftest import ASSETS, _tiny_model, batch_running, longest_gap, probe_models, until

pytestmark = pytest.mark.slow

CLIENTS = Path(__file__).parents[1] / "clients"


def _no_leak(body: dict[str, Any]) -> None:
    text = str(body)
    assert "Traceback" not in text and "/tmp" not in text and "/work" not in text


def test_v1_predict_batches_instances_in_order(live_server: Any) -> None:
    server = live_server(models=probe_models(batchSize=4, maxBatchDelay=200))
    instances = [{"echo": i} for i in range(3)]
    reply = httpx.post(
        f"{server.url}/v1/models/probe:predict", json={"instances": instances}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    predictions = reply.json()["predictions"]
    assert [p["echo"] for p in predictions] == [0, 1, 2]
    assert {p["batch"] for p in predictions} == {3}  # one request each, batched together


def test_kserve_sdk_v1_health_on_the_inference_listener(live_server: Any) -> None:
    """The kserve SDK's v1 client asks the port it predicts on (KServe's runtime moves the
    management API off it): ``GET /`` for liveness, ``GET /v1/models/{m}`` for readiness (503
    while not ready, as KServe's model server answers), ``GET /v1/models`` lists the models."""
    models = {
        "probe": {"1.0": {"marName": "probe.mar"}},
        "tiny": {"1.0": {"marName": "tiny.mar", "minWorkers": 0}},  # held at zero: not ready
    }
    server = live_server(models=models)
    args = [sys.executable, str(CLIENTS / "kserve_v1.py"), server.url, "probe", "tiny"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {
        "live": True,
        "ready": True,
        "idle": False,
        "unknown": 404,
        "models": {"models": ["probe", "tiny"]},
    }
    # KServe's model server lists them on its v2 path too.
    listed = httpx.get(f"{server.url}/v2/models", timeout=30)
    assert (listed.status_code, listed.json()) == (200, {"models": ["probe", "tiny"]})
    idle = httpx.get(f"{server.url}/v1/models/tiny", timeout=30)
    assert (idle.status_code, idle.json()) == (503, {"name": "tiny", "ready": False})
    # The management API keeps TorchServe's answer (200, ready false).
    managed = httpx.get(f"{server.management_url}/v1/models/tiny", timeout=30)
    assert (managed.status_code, managed.json()) == (200, {"name": "tiny", "ready": False})


BAD_BODIES = [
    b"not json",
    b'{"inputs": []}',
    b'{"instances": []}',
    b'{"instances": {"a": 1}}',
    b'{"instances": [{"bad": true}, {"echo": 1}]}',  # one instance fails the whole call
    b"[" * 100_000,  # nested past the parser's recursion limit (was a bare 500)
    b'{"instances": [' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"]}",
    b'{"instances": [{"echo": 1}, {"data": "\\ud800"}]}',  # a lone surrogate (was a bare 500)
    b'{"instances": [{"\\udfff": "x"}]}',
]


def test_v1_instance_rows_match_torchserves_kserve_envelope(
    live_server: Any, model_store: Path, tmp_path: Path
) -> None:
    """An object of strings ({"data": "<base64>"}, KServe's image examples) reaches the handler
    as the row itself, as TorchServe's kserve envelope passes it; anything else as the body."""
    package(
        ArchiveOptions(
            model_name="rows",
            version="1.0",
            serialized_file=_tiny_model(tmp_path / "model.pt"),
            handler=str(ASSETS / "row_handler.py"),
            export_path=model_store,
        )
    )
    server = live_server(models={"rows": {"1.0": {"marName": "rows.mar"}}})
    instances = [{"data": "aGk+Pz8=", "kind": "a&b=c"}, {"data": [1, 2]}, [0.5, 1], "text"]
    reply = httpx.post(
        f"{server.url}/v1/models/rows:predict", json={"instances": instances}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["predictions"] == [
        {"data": "aGk+Pz8=", "kind": "a&b=c"},
        {"body": {"data": [1, 2]}},
        {"body": [0.5, 1]},
        {"body": "text"},
    ]


def test_v1_predict_bad_input_is_4xx(live_server: Any) -> None:
    server = live_server(models=probe_models())
    for body in BAD_BODIES:
        reply = httpx.post(
            f"{server.url}/v1/models/probe:predict",
            content=body,
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert reply.status_code == 400, (body, reply.text)
        assert set(reply.json()) == {"code", "type", "message"}
        _no_leak(reply.json())
    # The model still serves afterwards.
    ok = httpx.post(f"{server.url}/predictions/probe", json={"echo": "after"}, timeout=30)
    assert ok.status_code == 200


def test_v1_predict_reads_content_encodings_as_the_other_inference_routes(
    live_server: Any,
) -> None:
    # The body was read as it came: gzip was a 400 'not valid JSON: utf-8 codec...', and a
    # plain JSON body labelled br ran as if it had no coding.
    server = live_server(models=probe_models())
    url = f"{server.url}/v1/models/probe:predict"
    body = json.dumps({"instances": [{"echo": 101}, {"echo": 102}]}).encode()

    def post(data: bytes, coding: str) -> httpx.Response:
        headers = {"content-type": "application/json", "content-encoding": coding}
        return httpx.post(url, content=data, headers=headers, timeout=30)

    for coding, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        reply = post(data, coding)
        assert reply.status_code == 200, (coding, reply.text)
        assert [p["echo"] for p in reply.json()["predictions"]] == [101, 102]
    bomb = gzip.compress(b" " * (8 << 20))  # 8 MiB past the 6553500-byte max_request_size
    for data, coding, status in (
        (body, "br", 415),
        (b"not gzip", "gzip", 400),
        (bomb, "gzip", 413),
    ):
        reply = post(data, coding)
        assert reply.status_code == status, (coding, reply.text)
        _no_leak(reply.json())
    ran = httpx.post(f"{server.url}/predictions/probe", json={"ran": True}, timeout=30).json()
    assert ran["ran"].count(101) == 2  # gzip and deflate ran; br never did


def test_v1_predict_routes(live_server: Any) -> None:
    server = live_server(models=probe_models())
    body = {"instances": [{"echo": 1}]}
    assert httpx.post(f"{server.url}/v1/models/nope:predict", json=body).status_code == 404
    # :explain is routed (test_explain_live.py); the probe handler has no explanations: 501.
    assert httpx.post(f"{server.url}/v1/models/probe:explain", json=body).status_code == 501
    # The path of GET /v1/models/{m} (readiness), another method: 405, as KServe answers.
    assert httpx.post(f"{server.url}/v1/models/probe:nope", json=body).status_code == 405
    assert httpx.post(f"{server.url}/v1/models/probe", json=body).status_code == 405
    assert httpx.get(f"{server.url}/v1/models/probe:predict").status_code == 405
    described = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert "post" in described["/v1/models/{model_name}:predict"]
    assert "post" in described["/v1/models/{model_name}:explain"]


def test_v1_predict_queue_full_cancels_the_admitted_instances(live_server: Any) -> None:
    """A slow batch runs and one request waits: instance 1 takes the queue's last place,
    instance 2 finds it full; the call gets 503 and instance 1 never runs."""
    server = live_server(models=probe_models(batchSize=1, jobQueueSize=2))
    url = f"{server.url}/predictions/probe"

    async def scenario() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as c:
            slow = asyncio.ensure_future(c.post(url, json={"sleep": 5}))
            while not await asyncio.to_thread(batch_running, server, "probe"):
                await asyncio.sleep(0.02)
            waiting = asyncio.ensure_future(c.post(url, json={"echo": "waiting"}))
            await asyncio.to_thread(until, lambda: _pending(server) == 1, "one request waits")
            # (a number among the values: the instance goes as JSON, as the probe takes it)
            body = {"instances": [{"echo": "cancelled", "n": 1}, {"echo": "refused", "n": 2}]}
            reply = await c.post(f"{server.url}/v1/models/probe:predict", json=body)
            assert [r.status_code for r in await asyncio.gather(slow, waiting)] == [200, 200]
            return reply

    reply = asyncio.run(scenario())
    assert reply.status_code == 503, reply.text
    assert reply.json()["type"] == "QueueFull"
    _no_leak(reply.json())
    ran = httpx.post(url, json={"ran": True}, timeout=30)
    assert ran.status_code == 200, ran.text
    assert "waiting" in ran.json()["ran"] and "cancelled" not in ran.json()["ran"]


def _pending(server: Any) -> int:
    described = httpx.get(f"{server.management_url}/models/probe", timeout=30).json()[0]
    return int(described["jobQueueStatus"]["pendingRequests"])


def test_v1_predict_with_more_instances_than_the_queue_holds_is_413(live_server: Any) -> None:
    """Such a call can never be queued whole: a 503 'retry later' was retried in vain."""
    server = live_server(models=probe_models(batchSize=1, jobQueueSize=2))
    body = {"instances": [{"echo": 1}, {"echo": 2}, {"echo": 3}]}
    reply = httpx.post(f"{server.url}/v1/models/probe:predict", json=body, timeout=30)
    assert reply.status_code == 413, reply.text
    assert "3 instances" in reply.json()["message"] and "(2)" in reply.json()["message"]
    _no_leak(reply.json())
    body = {"instances": [{"echo": 1}, {"echo": 2}]}
    reply = httpx.post(f"{server.url}/v1/models/probe:predict", json=body, timeout=30)
    assert reply.status_code == 200, reply.text


def test_v1_predict_of_a_million_instances_is_refused_without_making_them_all(
    live_server: Any,
) -> None:
    """More instances than the queue holds (100) are a 413 before any is made into a request:
    the whole body's instances were made first (each with a copy of the headers), holding the
    event loop about a minute and gigabytes of memory before a 503."""
    server = live_server(models=probe_models())
    body = b'{"instances":[' + b",".join([b"0"] * 1_000_000) + b"]}"
    started = time.monotonic()
    reply = httpx.post(
        f"{server.url}/v1/models/probe:predict",
        content=body,
        headers={"content-type": "application/json", "x-pad": "a" * 4000},
        timeout=300,
    )
    assert reply.status_code == 413 and "1000000 instances" in reply.text, reply.text
    assert time.monotonic() - started < 10  # was 60 s and more
    ok = httpx.post(f"{server.url}/predictions/probe", json={"echo": "after"}, timeout=30)
    assert ok.status_code == 200


def test_v1_predict_parses_a_large_body_in_steps_while_other_requests_are_answered(
    live_server: Any,
) -> None:
    """A body at the size limit (two million instances, 6 MB) is parsed in steps: /ping on
    another connection is answered all along, its longest wait a small part of the call. One
    json.loads held the event loop for the whole parse (seconds on a loaded machine): no other
    request on the server was answered meanwhile."""
    server = live_server(models=probe_models())
    body = b'{"instances": [' + b",".join([b"[]"] * 2_000_000) + b"]}"

    reply, longest, took = longest_gap(
        f"{server.url}/ping",
        lambda: httpx.post(
            f"{server.url}/v1/models/probe:predict",
            content=body,
            headers={"content-type": "application/json"},
            timeout=300,
        ),
    )
    assert reply.status_code == 413 and "2000000 instances" in reply.text, reply.text
    assert longest < took / 2, (longest, took)


def test_v1_predict_past_its_priority_levels_own_bound_is_a_413(live_server: Any) -> None:
    """A level's maxQueueSize bounds a v1 call as the model's queue does: 3 instances at a
    level that holds 2 could never be queued together (a 503 "retry later" was retried in
    vain); 2 are served."""
    levels = {
        "priorityLevels": 2,
        "defaultPriorityLevel": 2,
        "defaultQueuePolicy": {"maxQueueSize": 2},
    }
    server = live_server(models=probe_models(**levels))
    url = f"{server.url}/v1/models/probe:predict"
    three = {"instances": [{"echo": i} for i in range(3)]}
    reply = httpx.post(url, json=three, headers={"x-torchbay-priority": "1"}, timeout=60)
    assert reply.status_code == 413, reply.text
    assert "the queue of priority level 1 of this model holds (2)" in reply.text
    reply = httpx.post(url, json={"instances": three["instances"][:2]}, timeout=60)
    assert reply.status_code == 200, reply.text


def test_v1_predict_answer_is_bounded_as_one_response(live_server: Any) -> None:
    """Each instance's answer is under max_response_size, all of them past it: a 500, as
    TorchServe's one response for the call would be (it was sent, 2.5 x the bound)."""
    server = live_server(models=probe_models(batchSize=4), max_response_size=2000)
    url = f"{server.url}/v1/models/probe:predict"
    fits = httpx.post(url, json={"instances": [{"echo": "x" * 300, "n": 1}] * 2}, timeout=30)
    assert fits.status_code == 200, fits.text
    reply = httpx.post(url, json={"instances": [{"echo": "x" * 300, "n": 1}] * 10}, timeout=30)
    assert reply.status_code == 500, reply.text[:200]
    assert "max_response_size of 2000 bytes" in reply.json()["message"]
    _no_leak(reply.json())


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.properties"
    path.write_text(text)
    return path


def test_model_snapshot_models_load_like_models_entries(tmp_path: Path) -> None:
    snapshot = (
        '{"name":"startup.cfg","modelCount":1,"models":{"mnist":{"1.0":{"defaultVersion":true,'
        '"marName":"mnist.mar","minWorkers":1,"maxWorkers":5,"batchSize":1,"maxBatchDelay":10,'
        '"responseTimeout":120}}}}'
    )
    path = _write(tmp_path, f"model_snapshot={snapshot}\n")
    config, notes = load_server_config(ts_config=path, env={}, cli={})
    entry = config.models["mnist"]["1.0"]
    assert (entry.mar_name, entry.max_workers, entry.max_batch_delay_ms) == ("mnist.mar", 5, 10)
    assert not any("ignored TorchServe key 'model_snapshot'" in n for n in notes)
    # A models= entry of the same name wins over the snapshot's.
    both = _write(
        tmp_path, f'model_snapshot={snapshot}\nmodels={{"mnist":{{"1.0":{{"marName":"b.mar"}}}}}}\n'
    )
    config, _ = load_server_config(ts_config=both, env={}, cli={})
    assert config.models["mnist"]["1.0"].mar_name == "b.mar"


@pytest.mark.parametrize("value", ["{not json", '{"models": [1]}', "[1]", "[" * 100_000])
def test_model_snapshot_bad_json_is_a_config_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="model_snapshot"):
        load_server_config(ts_config=_write(tmp_path, f"model_snapshot={value}\n"), env={}, cli={})


@pytest.mark.parametrize("value", ["{not json", "[1]", "[" * 100_000])
def test_models_bad_json_is_a_config_error(tmp_path: Path, value: str) -> None:
    """Nested past the parser's recursion limit too (a RecursionError escaped, a traceback)."""
    with pytest.raises(ConfigError, match="models="):
        load_server_config(ts_config=_write(tmp_path, f"models={value}\n"), env={}, cli={})


def test_shared_address_makes_one_listener() -> None:
    shared = ServerConfig(
        inference_address="http://0.0.0.0:8085",
        management_address="http://0.0.0.0:8085",
        metrics_address="http://0.0.0.0:8082",
    )
    assert listener_names(shared) == ("inference", "metrics")
    assert not same_address("http://127.0.0.1:0", "http://127.0.0.1:0")  # two ephemeral ports
    assert not same_address("http://0.0.0.0:8085", "https://0.0.0.0:8085")
    apart = shared.model_copy(update={"management_address": "http://0.0.0.0:8081"})
    assert listener_names(apart) == ("inference", "management", "metrics")


@pytest.mark.parametrize(
    ("method", "path", "management"),
    [
        ("GET", "/models", True),
        ("PUT", "/models/m/1.0", True),
        ("GET", "/token", True),
        ("GET", "/v1/models/m", True),
        ("POST", "/v1/models/m:predict", False),
        ("GET", "/modelsx", False),
        ("GET", "/v2/models/m/ready", False),
        ("POST", "/predictions/m", False),
        ("GET", "/ping", False),
        # TorchServe's workflow management on a shared port (KServe's config) as on its own
        ("POST", "/workflows", True),
        ("GET", "/workflows/w", True),
        ("DELETE", "/workflows/w", True),
        ("GET", "/workflowsx", False),
        ("POST", "/wfpredict/w", False),
        # SageMaker's invoke is inference, with a trailing slash too (as TorchServe 0.12)
        ("POST", "/models/m/invoke", False),
        ("POST", "/models/m/invoke/", False),
        ("POST", "/models/m/invoke/x", True),
    ],
)
def test_management_paths(method: str, path: str, management: bool) -> None:
    assert is_management_path(method, path) is management


def test_model_snapshot_from_the_environment_and_metrics_format_is_a_known_key(
    tmp_path: Path,
) -> None:
    snapshot = '{"models": {"m": {"1.0": {"marName": "m.mar", "minWorkers": 2}}}}'
    env = {"TS_MODEL_SNAPSHOT": snapshot, "TORCHBAY_ENABLE_ENVVARS_CONFIG": "true"}
    config, _ = load_server_config(ts_config=None, env=env, cli={}, cwd=tmp_path)
    assert config.models["m"]["1.0"].mar_name == "m.mar"
    path = _write(tmp_path, "metrics_format=prometheus\n")
    _, notes = load_server_config(ts_config=path, env={}, cli={})
    assert any("ignored TorchServe key 'metrics_format'" in note for note in notes)


FORM_TEXT = st.text() | st.text(alphabet="aZ09+/=_.-~ %&\u00e9")  # base64's letters and others


@given(st.dictionaries(FORM_TEXT, FORM_TEXT, min_size=1))
@settings(max_examples=200, deadline=None)
def test_an_instance_of_strings_is_form_encoded_as_urlencode_does(instance) -> None:
    """The form of an instance of strings is ``urlencode``'s, written faster for base64 (a 6 MB
    image held the event loop 484 ms in ``quote_plus``)."""
    from torchbay.server.http.kserve_v1 import encode_instance

    try:
        expected = urlencode(instance).encode()
    except UnicodeEncodeError:  # a lone surrogate: the 400 below
        with pytest.raises(BadRequest):
            encode_instance(instance)
        return
    assert encode_instance(instance)[0] == expected


def test_a_base64_image_instance_is_form_encoded_as_urlencode_does() -> None:
    from torchbay.server.http.kserve_v1 import encode_instance

    image = base64.b64encode(bytes(range(256)) * 9000).decode()
    assert encode_instance({"data": image})[0] == urlencode({"data": image}).encode()


@pytest.mark.parametrize(
    "instance", [{"data": "iVBORw0KGgo="}, {"data": "caf\u00e9 + &=%", "target": "3"}]
)
def test_a_v1_instance_of_strings_is_the_handlers_row_with_its_strings(instance) -> None:
    """KServe's image examples send ``{"data": "<base64>"}``: the handler's row is the instance,
    its values str as in the JSON (the image handler base64-decodes a str), while a client's own
    form fields are bytearrays, as TorchServe 0.12 hands them. Was: the instance's strings came
    as bytearrays once form fields did, and every v1 image predict and explain was a 400."""
    from torchbay.handlers.runtime.envelopes import decode_request
    from torchbay.server.http.kserve_v1 import encode_instance

    body, content_type = encode_instance(instance)
    assert decode_request(body, content_type.decode(), "") == instance
    form = decode_request(body, "application/x-www-form-urlencoded", "")
    assert form == {k: bytearray(v.encode()) for k, v in instance.items()}
