"""Registering and unregistering workflows while others load, run or go, on a live torchbay:
a node that takes minutes to load holds up no other workflow, and an unregistration lets the
runs in flight finish. The nodes wait at gates the test opens (assets/workflow_gates.py); the
``.war``s are made by torch-workflow-archiver 0.2.15 (the dev extra)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, make_config, tiny_archive, until
from tests.server.workflow_store import LIVE_MARKS, build_workflow

pytestmark = LIVE_MARKS
GATES = Path(__file__).parent / "assets" / "workflow_gates.py"
SPECS = {
    "slowstart": "dag:\n  slow_start: []\n",
    "quick": "models:\n  retry-attempts: 0\ndag:\n  relay: []\n",
    "drained": "models:\n  retry-attempts: 0\ndag:\n  held: [relay]\n",
    "upload": "models:\n  retry-attempts: 0\ndag:\n  relay: []\n",
    "versioned": "models:\n  retry-attempts: 0\ndag:\n  relay: []\n",
    # pair's node one__two and pair__one's node two: both the model pair__one__two
    "pair": "models:\n  retry-attempts: 0\ndag:\n  one__two: []\n",
    "pair__one": "models:\n  retry-attempts: 0\n  two:\n    url: other.mar\ndag:\n  two: []\n",
    # stuck: loads until a gate the test never opens; broken fails to load once stuck loads
    "failfast": "models:\n  retry-attempts: 0\ndag:\n  stuck: [broken]\n",
}


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wf-gates")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, gates: Path) -> Iterator[LiveServer]:
    work = tmp_path_factory.mktemp("wf-lifecycle")
    handler = work / "workflow_gates.py"
    handler.write_text(GATES.read_text().replace("@GATES@", str(gates)))
    wars = work / "wars"
    for name, text in SPECS.items():
        (work / f"{name}.yaml").write_text(text)
        build_workflow(wars, name, work / f"{name}.yaml", handler)
    (work / "models").mkdir()
    # An operator's own version 2.0 of a node's model (test_an_operators_version_of_a_node...)
    tiny_archive(work, work / "models", "other", "tensor", version="2.0")
    config = make_config(work / "models", workflow_store=wars, enable_model_api=True)
    server = LiveServer(config).start()
    try:
        yield server
    finally:
        for gate in ("load", "release", "unstuck"):
            (gates / gate).touch()
        server.stop()


def _listed(live: LiveServer) -> set[str]:
    answer = httpx.get(f"{live.management_url}/workflows", timeout=60).json()
    return {w["workflowName"] for w in answer["workflows"]}


def test_a_node_that_loads_for_minutes_holds_up_no_other_workflow(
    live: LiveServer, gates: Path
) -> None:
    """Registering one workflow held a lock over its nodes' loads: every other workflow's
    registration and unregistration waited for it (TorchServe 0.12 answers them at once)."""
    workflows = f"{live.management_url}/workflows"
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(httpx.post, f"{workflows}?url=slowstart.war", timeout=600)
        try:
            until(lambda: (gates / "loading").exists(), "slow_start loads", timeout=120)
            # Never answered before the gate opens, if it waits for slowstart's load.
            quick = httpx.post(f"{workflows}?url=quick.war", timeout=90)
            assert quick.status_code == 200, quick.text
            answer = httpx.post(f"{live.url}/wfpredict/quick", content=b"hi", timeout=60)
            assert answer.status_code == 200 and answer.content == b"hi"
            assert httpx.delete(f"{workflows}/quick", timeout=90).status_code == 200
            assert _listed(live) == set()  # slowstart: not registered until its nodes are
            again = httpx.post(f"{workflows}?url=slowstart.war", timeout=90)
            assert again.status_code == 409, again.text
            assert httpx.get(f"{workflows}/slowstart", timeout=60).status_code == 404
        finally:
            (gates / "load").touch()
        assert slow.result().status_code == 200, slow.result().text
    assert _listed(live) == {"slowstart"}


def test_unregistering_lets_the_runs_in_flight_finish(live: LiveServer, gates: Path) -> None:
    """DELETE /workflows/{name} unregistered its nodes while a run was between them: the run's
    next node was gone and the client got 500 'Error executing relay' for a request accepted
    before the DELETE. Now the runs in flight finish first; a new request is a 404."""
    workflows = f"{live.management_url}/workflows"
    assert httpx.post(f"{workflows}?url=drained.war", timeout=300).status_code == 200
    with ThreadPoolExecutor(2) as pool:
        run = pool.submit(
            httpx.post, f"{live.url}/wfpredict/drained", content=b"payload", timeout=300
        )
        try:
            until(lambda: (gates / "held").exists(), "the held node runs", timeout=120)
            gone = pool.submit(httpx.delete, f"{workflows}/drained", timeout=300)
            until(lambda: "drained" not in _listed(live), "drained is unlisted", timeout=120)
            late = httpx.post(f"{live.url}/wfpredict/drained", content=b"late", timeout=60)
            assert late.status_code == 404, late.text
        finally:
            (gates / "release").touch()
        answer = run.result()
        assert answer.status_code == 200, answer.text
        assert answer.content == b"payload"
        assert gone.result().status_code == 200, gone.result().text
    for node in ("held", "relay"):
        described = httpx.get(f"{live.management_url}/models/drained__{node}", timeout=60)
        assert described.status_code == 404, described.text


def test_a_workflow_unregistered_while_a_request_uploads_is_that_requests_404(
    live: LiveServer,
) -> None:
    """The workflow was looked up before the body came only: unregistered meanwhile, the
    request ran on its removed nodes and was a 500 'Error executing relay'."""
    workflows = f"{live.management_url}/workflows"
    assert httpx.post(f"{workflows}?url=upload.war", timeout=300).status_code == 200
    body = b"payload"
    head = (
        "POST /wfpredict/upload HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", live.server.state.ports.inference)) as sock:
        sock.settimeout(120)
        sock.sendall(head.encode())
        # 100 Continue: the endpoint found the workflow and waits for the body
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = sock.recv(1024)
            assert chunk, interim
            interim += chunk
        assert interim.startswith(b"HTTP/1.1 100 "), interim
        assert httpx.delete(f"{workflows}/upload", timeout=120).status_code == 200
        sock.sendall(body)
        answer = b""
        while b"}" not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 404 "), answer
    assert b'"message":"Workflow not found: upload"' in rest, answer


def _versions(live: LiveServer, model: str) -> dict[str, bool]:
    """``model``'s registered versions, each with whether it is the default (describe)."""
    described = httpx.get(f"{live.management_url}/models/{model}/all", timeout=60)
    if described.status_code == 404:
        return {}
    assert described.status_code == 200, described.text
    return {d["modelVersion"]: d["isDefault"] for d in described.json()}


@pytest.mark.parametrize("default", ["2.0", "1.0"])
def test_an_operators_version_of_a_node_model_stays_and_the_workflows_goes(
    live: LiveServer, default: str
) -> None:
    """An operator registered version 2.0 of a node's model (versioned__relay) beside the
    node's own 1.0: unregistering the workflow removed the model's default version, or failed
    (logged) when that default had another version beside it; the node's 1.0 stayed behind,
    and registering the workflow again was a 500 (version 1.0 already registered). Now the
    workflow removes exactly the version it registered, the default or not, and the
    operator's stays."""
    workflows, models = f"{live.management_url}/workflows", f"{live.management_url}/models"
    node = "versioned__relay"
    assert httpx.post(f"{workflows}?url=versioned.war", timeout=300).status_code == 200
    mine = httpx.post(f"{models}?url=other.mar&model_name={node}", timeout=300)
    assert mine.status_code == 200, mine.text
    made = httpx.put(f"{models}/{node}/{default}/set-default", timeout=60)
    assert made.status_code == 200, made.text
    assert _versions(live, node) == {"1.0": default == "1.0", "2.0": default == "2.0"}
    gone = httpx.delete(f"{workflows}/versioned", timeout=300)
    assert gone.status_code == 200, gone.text
    assert _versions(live, node) == {"2.0": True}
    again = httpx.post(f"{workflows}?url=versioned.war", timeout=300)
    assert again.status_code == 200, again.text
    assert _versions(live, node) == {"1.0": False, "2.0": True}
    assert httpx.delete(f"{workflows}/versioned", timeout=300).status_code == 200
    assert _versions(live, node) == {"2.0": True}
    assert httpx.delete(f"{models}/{node}", timeout=300).status_code == 200


def test_a_node_whose_model_name_another_workflows_node_has_is_refused(live: LiveServer) -> None:
    """Workflow pair's node one__two and pair__one's node two are both the model
    pair__one__two. pair__one's node (version 2.0) was registered as a second version of
    pair's node model: 200, and pair__one's runs were answered by pair's node (the default
    version); registered the other way round or at once, a failing one's rollback took the
    name out of the ones config snapshots leave out. Now the second is refused before any
    node loads, in TorchServe's words, and the first one's model is untouched."""
    workflows = f"{live.management_url}/workflows"
    assert httpx.post(f"{workflows}?url=pair.war", timeout=300).status_code == 200
    refused = httpx.post(f"{workflows}?url=pair__one.war", timeout=300)
    assert refused.status_code == 500, refused.text
    assert refused.json()["message"] == (
        "Workflow pair__one has failed to register. Failures: [Workflow Node pair__one__two "
        "failed to register. Details: Model pair__one__two serves node one__two of workflow pair]"
    )
    assert _versions(live, "pair__one__two") == {"1.0": True}
    assert httpx.get(f"{workflows}/pair__one", timeout=60).status_code == 404
    answer = httpx.post(f"{live.url}/wfpredict/pair", content=b"hi", timeout=120)
    assert answer.status_code == 200 and answer.content == b"hi"
    assert httpx.delete(f"{workflows}/pair", timeout=300).status_code == 200
    assert _versions(live, "pair__one__two") == {}


def test_a_node_that_fails_stops_the_others_loading(live: LiveServer, gates: Path) -> None:
    """failfast's broken node fails to load once its stuck node loads, which it does until a
    gate that never opens: the registration waited for stuck's load (here its 300 s bound,
    minutes for a big model) before its 500. Now broken's failure stops stuck while it loads
    (and, the second time, maybe before) and the 500, naming broken alone, comes then;
    stuck's model is gone, so the same registration again is the same 500."""
    workflows = f"{live.management_url}/workflows"
    want = (
        "Workflow failfast has failed to register. Failures: [Workflow Node failfast__broken "
        "failed to register. Details: "
    )
    for _ in range(2):
        # Within 120 s on a loaded host; stuck's load alone takes 300 s.
        refused = httpx.post(f"{workflows}?url=failfast.war", timeout=120)
        assert refused.status_code == 500, refused.text
        assert refused.json()["message"].startswith(want), refused.text
        assert "stuck" not in refused.json()["message"]
        assert (gates / "stuck").exists()  # stuck was loading when broken failed
        assert _versions(live, "failfast__stuck") == {}
        assert httpx.get(f"{workflows}/failfast", timeout=60).status_code == 404
