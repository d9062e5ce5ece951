"""Workflows on a live torchbay, beyond the recorded TorchServe steps: a workflow registered at
start-up (``load_workflows``), a node's retries and timeout, a function node that kills its
worker (the frontend lives on), a hostile ``.war``, and the model API switch. The ``.war``s are
made by torch-workflow-archiver 0.2.15 (the dev extra)."""

from __future__ import annotations

import json
import shutil
import socket
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import (
    LiveServer,
    batch_running,
    make_config,
    running,
    tiny_archive,
    until,
)
from tests.server.workflow_store import (
    DATA,
    LIVE_MARKS,
    build_model_store,
    build_workflow,
)
from torchbay.server.config.properties import parse_properties

pytestmark = LIVE_MARKS
FAULTS = Path(__file__).parent / "assets" / "workflow_faults.py"
SPECS = {
    # count runs 1 + 2 retries before the workflow gives up
    "retry": "models:\n  retry-attempts: 2\n  double:\n    url: double.mar\n"
    "dag:\n  count: [double]\n",
    "slow": "models:\n  retry-attempts: 0\n  timeout-ms: 300\ndag:\n  nap: [echo]\n",
    "crash": "models:\n  retry-attempts: 0\ndag:\n  crash: [echo]\n",
    "napper": "models:\n  retry-attempts: 0\ndag:\n  echo: [nap]\n",
    # fields gets its two parents' outputs as one form (fan-in)
    "fanin": "models:\n  retry-attempts: 0\n"
    "dag:\n  passthrough: [constant, fields]\n  constant: [fields]\n",
    "leaves": "models:\n  retry-attempts: 0\ndag:\n  passthrough: [relay, constant]\n",
    "flood": "models:\n  retry-attempts: 0\ndag:\n  flood: []\n",
    "no_wait": "models:\n  timeout-ms: 0\ndag:\n  echo: []\n",
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    models = build_model_store(tmp_path_factory.mktemp("wf-live-models"))
    wars = tmp_path_factory.mktemp("wf-live-wars")
    build_workflow(wars, "arith", DATA / "arith.yaml", DATA / "workflow_handler.py")
    specs = tmp_path_factory.mktemp("wf-live-specs")
    for name, text in SPECS.items():
        (specs / f"{name}.yaml").write_text(text)
        build_workflow(wars, name, specs / f"{name}.yaml", FAULTS)
    with zipfile.ZipFile(wars / "evil.war", "w") as war:  # a member that climbs out
        war.writestr("WAR-INF/MANIFEST.json", "{}")
        war.writestr("../evil.py", "print('outside')\n")
    return models, wars


@pytest.fixture(scope="module")
def live(stores: tuple[Path, Path]) -> Iterator[LiveServer]:
    models, wars = stores
    config = make_config(
        models, workflow_store=wars, load_workflows=["arith.war"], enable_model_api=True
    )
    server = LiveServer(config).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_start_up_workflow_is_registered_and_answers(live: LiveServer) -> None:
    listed = httpx.get(f"{live.management_url}/workflows", timeout=60).json()
    assert listed == {"workflows": [{"workflowName": "arith", "workflowUrl": "arith.war"}]}
    answer = httpx.post(f"{live.url}/wfpredict/arith", json={"values": [2]}, timeout=120)
    assert answer.status_code == 200
    assert answer.json() == {"sum": [8.0], "inputs": ["double", "square"]}


def test_a_compressed_request_is_inflated_once_by_the_start_node(live: LiveServer) -> None:
    """The children get their parents' outputs, never the request's Content-Encoding."""
    import gzip

    body = gzip.compress(b'{"values": [3]}')
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    answer = httpx.post(f"{live.url}/wfpredict/arith", content=body, headers=headers, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"sum": [15.0], "inputs": ["double", "square"]}


@pytest.mark.parametrize(
    ("name", "value"), [("x-torchbay-priority", "abc"), ("x-torchbay-timeout-us", "-1")]
)
def test_a_malformed_schedule_header_is_the_clients_400(
    live: LiveServer, name: str, value: str
) -> None:
    """Every node gets the request's headers, so every node refused it: the workflow answered
    500 'Error executing pre_processing' after its retries."""
    headers = {name: value}
    answer = httpx.post(f"{live.url}/wfpredict/arith", json={"values": [1]}, headers=headers)
    assert answer.status_code == 400, answer.text
    assert answer.json()["message"].startswith("Invalid parameter(s): X-Torchbay-")


def test_a_failing_node_is_retried_then_named(live: LiveServer, tmp_path: Path) -> None:
    register = httpx.post(f"{live.management_url}/workflows?url=retry.war", timeout=300)
    assert register.status_code == 200, register.text
    log = tmp_path / "count.log"
    ok = httpx.post(
        f"{live.url}/wfpredict/retry", json={"log": str(log), "values": [4]}, timeout=120
    )
    assert ok.status_code == 200 and ok.json() == {"double": [8.0]}
    assert log.read_text().count("ran") == 1
    log.unlink()
    failed = httpx.post(
        f"{live.url}/wfpredict/retry", json={"log": str(log), "values": [4], "fail": 1}, timeout=120
    )
    assert failed.status_code == 500
    assert failed.json()["message"] == "Error executing count"
    assert log.read_text().count("ran") == 3  # the first attempt and retry-attempts: 2


def test_a_node_past_its_timeout_fails_the_workflow(
    live: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The try that timed out is the node model's 504 (metrics, access line), and the log says
    why it failed; it was recorded as a client that left (499), logged with no reason."""
    assert httpx.post(f"{live.management_url}/workflows?url=slow.war", timeout=300).is_success
    with caplog.at_level("WARNING", logger="torchbay.workflows"):
        answer = httpx.post(f"{live.url}/wfpredict/slow", json={"values": [1]}, timeout=120)
    assert answer.status_code == 500
    assert answer.json() == {
        "code": 500, "type": "InternalServerException", "message": "Error executing nap",
    }  # fmt: skip
    until(lambda: bool(_answered(live, "slow__nap")), "the nap request is recorded")
    assert _answered(live, "slow__nap") == {"504": 1.0}
    assert "node nap failed (attempt 1 of 1): no answer within its timeout-ms (300)" in caplog.text


def test_a_timeout_of_zero_is_refused_at_registration(live: LiveServer) -> None:
    """TorchServe 0.12 registers a workflow whose timeout-ms is 0 and fails every request
    (tests/data/torchserve/workflow_timeout); torchbay ran it with no timeout at all. It is
    refused now, with a 400 that names the setting, and nothing is registered."""
    answer = httpx.post(f"{live.management_url}/workflows?url=no_wait.war", timeout=300)
    assert answer.status_code == 400, answer.text
    assert answer.json()["message"] == (
        "Invalid workflow specification: models timeout-ms must be above 0, got 0"
    )
    listed = httpx.get(f"{live.management_url}/workflows", timeout=60).json()["workflows"]
    assert "no_wait" not in {w["workflowName"] for w in listed}
    assert httpx.get(f"{live.management_url}/models/no_wait__echo", timeout=60).status_code == 404


def test_a_function_that_kills_its_worker_leaves_the_frontend_serving(live: LiveServer) -> None:
    assert httpx.post(f"{live.management_url}/workflows?url=crash.war", timeout=300).is_success
    answer = httpx.post(f"{live.url}/wfpredict/crash", json={"values": [1]}, timeout=120)
    assert answer.status_code == 500
    assert answer.json()["message"] == "Error executing crash"
    assert httpx.get(f"{live.url}/ping", timeout=60).status_code in (200, 500)
    again = httpx.post(f"{live.url}/wfpredict/arith", json={"values": [1]}, timeout=120)
    assert again.status_code == 200 and again.json()["sum"] == [3.0]


def test_a_parent_output_holding_the_form_boundary_reaches_its_child_whole(
    live: LiveServer,
) -> None:
    """A fan-in node's form must not be framed by a boundary that a parent's output (here the
    client's bytes, passed through) can contain: the child would get them cut, or a field the
    client made up."""
    assert httpx.post(f"{live.management_url}/workflows?url=fanin.war", timeout=300).is_success
    forged = (
        b'x\r\n--torchbay-workflow-node\r\nContent-Disposition: form-data; name="forged"; '
        b'filename="forged"\r\nContent-Type: application/octet-stream\r\n\r\nmade up'
    )
    answer = httpx.post(f"{live.url}/wfpredict/fanin", content=forged, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"passthrough": forged.decode("latin-1"), "constant": "constant"}


def _answered(live: LiveServer, model: str) -> dict[str, float]:
    """``model``'s recorded requests by status code (the metrics)."""
    text = httpx.get(f"{live.metrics_url}/metrics", timeout=60).text
    return {
        sample.labels["code"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "torchbay_requests_total" and sample.labels.get("model") == model
    }


def test_a_client_that_leaves_cancels_the_node_still_running(live: LiveServer) -> None:
    assert httpx.post(f"{live.management_url}/workflows?url=napper.war", timeout=300).is_success
    body = json.dumps({"values": [1]}).encode()
    head = f"POST /wfpredict/napper HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", live.server.state.ports.inference)) as sock:
        sock.sendall(head.encode() + body)
        until(lambda: batch_running(live, "napper__nap"), "the nap node runs")
    # The client left while nap ran (3 s): its request is cancelled (499), not answered 200.
    until(lambda: bool(_answered(live, "napper__nap")), "the nap request is recorded")
    assert _answered(live, "napper__nap") == {"499": 1.0}


def test_a_node_streaming_past_max_response_size_fails_the_workflow(live: LiveServer) -> None:
    """A streaming node's parts are its output, gathered: bounded as one response is (6.5 MB by
    default); they were gathered without bound (12 MB answered 200 here)."""
    assert httpx.post(f"{live.management_url}/workflows?url=flood.war", timeout=300).is_success
    small = httpx.post(f"{live.url}/wfpredict/flood", json={"parts": 2}, timeout=120)
    assert small.status_code == 200 and len(small.content) == 2_000_003
    answer = httpx.post(f"{live.url}/wfpredict/flood", json={"parts": 12}, timeout=120)
    assert answer.status_code == 500, len(answer.content)
    assert answer.json()["message"] == "Error executing flood"


@pytest.mark.parametrize(
    ("body", "relayed"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "[" * 100_000 + "]" * 100_000),  # was a bare 500
        (b"NaN", "NaN"),  # no JSON value: its text
        (b" 1e999\n", 1e999),  # JSON, as it came: was written back as Infinity
    ],
)
def test_several_leaves_answer_json_whatever_the_leaves_answered(
    live: LiveServer, body: bytes, relayed: object
) -> None:
    """The leaves' outputs (here the client's bytes, passed on) as one JSON object: one that
    the parser refused to nest (RecursionError) was an 'Internal Server Error', a JSON number
    past a float's range came back as Python's Infinity, which no strict reader takes."""
    registered = httpx.get(f"{live.management_url}/workflows", timeout=60).json()["workflows"]
    if "leaves" not in {w["workflowName"] for w in registered}:
        assert httpx.post(f"{live.management_url}/workflows?url=leaves.war", timeout=300).is_success
    answer = httpx.post(f"{live.url}/wfpredict/leaves", content=body, timeout=120)
    assert answer.status_code == 200, answer.text[:200]
    assert b"Infinity" not in answer.content and b"NaN," not in answer.content
    assert json.loads(answer.content) == {"relay": relayed, "constant": "constant"}


def test_a_war_whose_member_climbs_out_is_refused(
    live: LiveServer, stores: tuple[Path, Path]
) -> None:
    answer = httpx.post(f"{live.management_url}/workflows?url=evil.war", timeout=120)
    assert answer.status_code == 400
    body = answer.json()
    assert body["type"] == "InvalidWorkflowException"
    assert "../evil.py" in body["message"]
    assert str(stores[1]) not in body["message"] and "Traceback" not in body["message"]
    assert not (stores[1].parent / "evil.py").exists()
    listed = httpx.get(f"{live.management_url}/workflows", timeout=60).json()["workflows"]
    assert "evil" not in {w["workflowName"] for w in listed}


def test_a_model_named_like_a_node_of_a_workflow_is_snapshotted(
    stores: tuple[Path, Path], tmp_path: Path
) -> None:
    """Only the workflow's own nodes are left out of a config snapshot: a model the operator
    registered as ``arith__extra`` was left out too (every name starting ``arith__``), and was
    gone after a restart."""
    models, wars = stores
    config = {"load_workflows": ["arith.war"], "enable_model_api": True, "snapshot_dir": tmp_path}
    with running(models, workflow_store=wars, **config) as server:
        params = {"url": "double.mar", "model_name": "arith__extra", "synchronous": "true"}
        answer = httpx.post(f"{server.management_url}/models", params=params, timeout=120)
        assert answer.status_code == 200, answer.text
        newest = sorted(tmp_path.iterdir())[-1]
        snapshot = json.loads(parse_properties(newest.read_text())["model_snapshot"])
    assert sorted(snapshot["models"]) == ["arith__extra"]  # not arith's nodes, as TorchServe


def test_an_operators_version_of_a_node_model_is_snapshotted(
    stores: tuple[Path, Path], tmp_path: Path
) -> None:
    """A version 2.0 of arith's node model arith__double, registered by the operator, was left
    out of config snapshots with the node's own 1.0 (every version of a node's model name), so
    a restart from the snapshot lost it. Now only the versions arith's nodes registered are."""
    models, wars = stores
    store = tmp_path / "models"
    shutil.copytree(models, store)
    tiny_archive(tmp_path, store, "double_v2", "tensor", version="2.0")
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    config = {"load_workflows": ["arith.war"], "enable_model_api": True, "snapshot_dir": snapshots}
    with running(store, workflow_store=wars, **config) as server:
        params = {"url": "double_v2.mar", "model_name": "arith__double"}
        answer = httpx.post(f"{server.management_url}/models", params=params, timeout=120)
        assert answer.status_code == 200, answer.text
        newest = sorted(snapshots.iterdir())[-1]
        snapshot = json.loads(parse_properties(newest.read_text())["model_snapshot"])
    assert {m: sorted(v) for m, v in snapshot["models"].items()} == {"arith__double": ["2.0"]}


def test_registering_needs_the_model_api(stores: tuple[Path, Path]) -> None:
    models, wars = stores
    with running(models, workflow_store=wars) as server:
        register = httpx.post(f"{server.management_url}/workflows?url=arith.war", timeout=60)
        assert register.status_code == 405
        unregister = httpx.delete(f"{server.management_url}/workflows/arith", timeout=60)
        assert unregister.status_code == 405
        assert httpx.get(f"{server.management_url}/workflows", timeout=60).json() == {
            "workflows": []
        }


def test_with_token_auth_each_workflow_route_needs_its_key(
    stores: tuple[Path, Path], tmp_path: Path
) -> None:
    import json

    models, wars = stores
    key_file = tmp_path / "key_file.json"
    config = make_config(
        models,
        workflow_store=wars,
        load_workflows=["arith.war"],
        disable_token_authorization=False,
        key_file=key_file,
    )
    server = LiveServer(config).start()
    try:
        keys = {k: v["key"] for k, v in json.loads(key_file.read_text()).items()}
        bearer = {k: {"Authorization": f"Bearer {v}"} for k, v in keys.items()}
        predict = f"{server.url}/wfpredict/arith"
        listed = f"{server.management_url}/workflows"
        assert httpx.post(predict, json={"values": [1]}, timeout=60).status_code == 401
        wrong = httpx.post(predict, json={"values": [1]}, headers=bearer["management"], timeout=60)
        assert wrong.status_code == 401
        right = httpx.post(predict, json={"values": [1]}, headers=bearer["inference"], timeout=120)
        assert right.status_code == 200 and right.json()["sum"] == [3.0]
        assert httpx.get(listed, timeout=60).status_code == 401
        assert httpx.get(listed, headers=bearer["inference"], timeout=60).status_code == 401
        assert httpx.get(listed, headers=bearer["management"], timeout=60).status_code == 200
    finally:
        server.stop()
