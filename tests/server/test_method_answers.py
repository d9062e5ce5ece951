"""Which methods the inference routes take, and what they answer, against TorchServe 0.12's
answers (tests/data/torchserve/methods: record.py asked TorchServe cases.py's requests; the same
requests here, to a live torchbay over archives of the same handler built by our archiver)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import longest_gap, recorded, recorded_store, running, until

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "methods"
cases, RECORD = recorded(DATA, "cases.py")
RECORDED = {answer["id"]: answer for answer in RECORD["answers"]["cases"]}
REQUESTS = {case[0]: case[1:] for case in cases.CASES}
INFERENCE = cases.INF


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_store(tmp_path_factory, "methods", cases.ARCHIVES, DATA)


def _models(*names: str) -> dict[str, Any]:
    """``models=`` for the record's archives (all, or those named), one worker each."""
    return {
        name: {version: {"marName": file, "defaultVersion": True, "minWorkers": 1}}
        for file, (name, version, _) in cases.ARCHIVES.items()
        if name in names or not names
    }


@pytest.fixture(scope="module")
def bases(store: Path) -> Iterator[dict[str, str]]:
    """A live torchbay serving every archive of the record, one worker each, ready."""
    with running(store, models=_models(), enable_model_api=True) as live:
        for name, _, _ in cases.ARCHIVES.values():
            url = f"{live.management_url}/models/{name}"
            until(lambda url=url: _ready(url), f"{url} has a READY worker", timeout=300)
        yield {
            "inference": live.url,
            "management": live.management_url,
            "metrics": live.metrics_url,
        }


def _ready(url: str) -> bool:
    answer = httpx.get(url, timeout=60)
    return answer.status_code == 200 and any(
        w["status"] == "READY" for w in answer.json()[0]["workers"]
    )


def comparable(answer: dict[str, Any]) -> tuple[int, Any]:
    """An answer's status and body as compared: an error body by its code and message (its type
    is Java's class name there), an API description by its title (torchbay's has more paths), a
    describe by its models' names and versions."""
    body = answer["body"]
    if isinstance(body, dict) and "code" in body and "message" in body:
        body = {"code": body["code"], "message": body["message"]}
    elif isinstance(body, dict) and "openapi" in body:
        body = {"title": body["title"]}
    elif isinstance(body, list) and all(isinstance(m, dict) and "modelName" in m for m in body):
        body = [[m["modelName"], m["modelVersion"]] for m in body]
    return answer["status"], body


def ask(bases: dict[str, str], case: str) -> dict[str, Any]:
    return cases.ask(bases, *REQUESTS[case])


def assert_as_torchserve(bases: dict[str, str], ids: tuple[str, ...]) -> None:
    got = {case: comparable(ask(bases, case)) for case in ids}
    assert got == {case: comparable(RECORDED[case]) for case in ids}


def raw_twice(base: str, first: str) -> bytes:
    """``first`` (a request line) then ``GET /ping`` on one connection, everything read back."""
    host, port = base.rsplit("//", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(
            f"{first} HTTP/1.1\r\nHost: x\r\n\r\n"
            "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_record_is_torchserve_0_12s() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert RECORD["command"].endswith("tests/data/torchserve/methods/record.py")


PING = ("options_ping", "delete_ping", "post_ping", "put_ping", "head_ping", "ping_slash")


def test_ping_answers_every_method_and_a_trailing_slash_as_torchserve(
    bases: dict[str, str],
) -> None:
    """TorchServe's /ping checks no method: HEAD (a load balancer's health check), OPTIONS,
    POST, PUT, DELETE and ``/ping/`` are health checks too. torchbay answered each 404
    'Requested resource is not found', so a HEAD health check saw a server without /ping."""
    assert_as_torchserve(bases, (*PING, "ping_slashes"))


def test_head_ping_sends_no_body(bases: dict[str, str]) -> None:
    """A HEAD answer carries the GET's headers and no body bytes: the next answer on the same
    connection starts right after the HEAD answer's headers."""
    raw = raw_twice(bases["inference"], "HEAD /ping")
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), raw
    assert b"content-length: 20" in head.lower(), head  # {"status":"Healthy"}'s length
    assert rest.startswith(b"HTTP/1.1 200"), raw
    assert rest.endswith(b'{"status":"Healthy"}'), raw


MODEL_API = (
    "options_predictions",
    "options_predictions_version",
    "options_predictions_unknown",
    "options_predictions_unknown_version",
    "options_predictions_dotted",
    "options_explanations",
)
ANY_METHOD = (
    "delete_predictions",
    "delete_predictions_body",
    "patch_predictions",
    "head_predictions",
    "delete_predictions_version",
    "delete_predictions_unknown",
)


def test_predictions_take_every_method_and_options_describes_the_model(
    bases: dict[str, str],
) -> None:
    """TorchServe's /predictions and /explanations check no method: DELETE, PATCH and HEAD run
    the model as POST does (a body or none), OPTIONS answers the model's API description (404
    for a model or version it lacks). torchbay answered all of them 404 'Requested resource is
    not found', which tells a client the route, or the model, does not exist."""
    assert_as_torchserve(bases, (*MODEL_API, *ANY_METHOD))
    described = ask(bases, "options_predictions")["body"]
    assert "/predictions/echo" in described["paths"]
    assert "/v2/models/echo/infer" in described["paths"]
    assert not any("{model_name}" in path for path in described["paths"])


def test_delete_on_explanations_explains(bases: dict[str, str]) -> None:
    """Any method on /explanations is the explanation, as POST: the same answer."""
    post, delete = ask(bases, "post_explanations"), ask(bases, "delete_explanations")
    assert (delete["status"], delete["body"]) == (post["status"], post["body"])
    assert RECORDED["delete_explanations"]["status"] == RECORDED["post_explanations"]["status"]


def test_head_predictions_runs_the_model_and_sends_no_body(bases: dict[str, str]) -> None:
    raw = raw_twice(bases["inference"], "HEAD /predictions/echo")
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), raw
    assert rest.startswith(b"HTTP/1.1 200") and rest.endswith(b'{"status":"Healthy"}'), raw


# case -> the methods the path takes: KServe's and the Open Inference Protocol's routes answer
# another method 405 with Allow, as KServe's model server (FastAPI) and Triton do. TorchServe
# runs the model on any method on its own KServe paths and has no /v2/health (the record).
NOT_ALLOWED = {
    "options_v1_predict": "POST",
    "get_v1_predict": "POST",
    "delete_v1_predict": "POST",
    "options_v2_infer": "POST",
    "get_v2_infer": "POST",
    "delete_v2_infer": "POST",
    "options_v2_ready": "GET",
    "delete_v2_ready": "GET",
    "head_v2_ready": "GET",
    "head_v2_live": "GET",
}


def test_a_wrong_method_on_kserve_and_oip_routes_is_405_with_allow(bases: dict[str, str]) -> None:
    """DELETE /v2/health/ready answered 404 'No route for DELETE /v2/health/ready', as if the
    server served no OIP (Triton: 405), and no 405 said which methods its path takes (RFC 9110:
    a 405 carries Allow; Starlette's, KServe's, does)."""
    got = {case: ask(bases, case) for case in NOT_ALLOWED}
    assert {case: (a["status"], a["allow"]) for case, a in got.items()} == {
        case: (405, allow) for case, allow in NOT_ALLOWED.items()
    }
    for case, answer in got.items():
        if REQUESTS[case][1] != "HEAD":
            assert ("error" in answer["body"]) == REQUESTS[case][2].startswith("/v2"), answer


def test_a_customized_describe_writes_torchserves_handler_metrics(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchServe's backend times a describe (``?customized=true``) as any call of the handler:
    model_metrics.log gets its HandlerTime and PredictionTime, ts_metrics.log its
    WorkerThreadTime (the record). torchbay wrote none of them since a describe stopped counting
    as an inference (it still counts in no inference metric)."""
    monkeypatch.setenv("METRICS_LOCATION", str(tmp_path))
    settings = {"metrics_mode": "log", "disable_system_metrics": True}
    with running(store, models=_models("echo"), **settings) as live:
        url = f"{live.management_url}/models/echo"
        until(lambda: _ready(url), f"{url} has a READY worker", timeout=300)
        described = httpx.get(url, params={"customized": "true"}, timeout=120)
        assert described.status_code == 200, described.text
        assert described.json()[0]["customizedMetadata"] == {"described": True}
    # stopped: the logs are flushed and closed
    recorded_describe = RECORD["answers"]["describe_customized"]
    model_lines = cases.metric_lines((tmp_path / "model_metrics.log").read_text())
    assert model_lines == recorded_describe["model_metrics"]
    ts_lines = (tmp_path / "ts_metrics.log").read_text().splitlines()
    loads = sum(" - WorkerLoadTime." in line for line in ts_lines)
    # one WorkerThreadTime per worker start (TorchServe's load is a job too), one the describe's
    assert sum(" - WorkerThreadTime." in line for line in ts_lines) == loads + 1


def _inferences(bases: dict[str, str], model: str) -> int:
    stats = httpx.get(f"{bases['inference']}/v2/models/{model}/stats", timeout=60).json()
    return stats["model_stats"][0]["inference_count"]


def test_invocations_takes_the_model_from_a_form_field(bases: dict[str, str]) -> None:
    """SageMaker's /invocations with several start-up models and no ``model_name`` query
    parameter: TorchServe 0.12 takes the model from the body's form field ``model_name``
    (urlencoded or multipart; tests/data/torchserve/sagemaker, invocations_form_field).
    torchbay answered 400 'Parameter model_name is required.'."""
    url = f"{bases['inference']}/invocations"
    # every request answered so far is recorded once a scrape is answered (LiveServer.recorded)
    assert httpx.get(f"{bases['metrics']}/metrics", timeout=60).status_code == 200
    before = _inferences(bases, "a.b-c")
    urlencoded = httpx.post(url, data={"model_name": "a.b-c", "x": "1"}, timeout=120)
    files = {"data": ("x.bin", b"\x00\xff" * 100, "application/octet-stream")}
    multipart = httpx.post(url, data={"model_name": "a.b-c"}, files=files, timeout=120)
    assert urlencoded.status_code == 200, urlencoded.text  # its fields are the handler's input
    assert multipart.status_code == 200, multipart.text
    until(lambda: _inferences(bases, "a.b-c") == before + 2, "both ran on a.b-c")
    unknown = httpx.post(url, data={"model_name": "nope"}, timeout=120)
    assert (unknown.status_code, unknown.json()["message"]) == (404, "Model not found: nope")
    unnamed = httpx.post(url, json={"model_name": "a.b-c"}, timeout=120)  # JSON is no form
    assert (unnamed.status_code, unnamed.json()["message"]) == (
        400,
        "Parameter model_name is required.",
    )


def test_an_invocations_form_is_read_off_the_event_loop(bases: dict[str, str]) -> None:
    """With several models, /invocations reads the model from a form field: the form was
    parsed on the event loop (Python's email parser), so a 6 MB form of many short lines held
    every other request of the server for seconds."""
    boundary = "edge"
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="data"\r\n\r\n'
    tail = f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="model_name"\r\n\r\n'
    body = (
        head.encode() + b"a\n" * 3_000_000 + tail.encode() + f"a.b-c\r\n--{boundary}--\r\n".encode()
    )
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    answer, longest, took = longest_gap(
        f"{bases['inference']}/ping",
        lambda: httpx.post(
            f"{bases['inference']}/invocations", content=body, headers=headers, timeout=120
        ),
    )
    assert answer.status_code == 200, answer.text
    assert longest < took / 4, (longest, took)


def test_a_model_name_is_percent_decoded_once(bases: dict[str, str]) -> None:
    """/predictions/ech%256F asks for the model ``ech%6F``, as TorchServe and torchbay's own
    management API read it (404); torchbay's inference routes decoded the path a second time
    and served ``echo``: a name no client asked for."""
    twice = ("predictions_encoded_twice", "predictions_version_encoded_twice")
    assert_as_torchserve(bases, (*twice, "describe_encoded_twice", "predictions_encoded_letter"))
    base = bases["inference"]
    for method, path in (
        ("GET", "/v2/models/ech%256F/ready"),
        ("POST", "/v2/models/ech%256F/infer"),
        ("POST", "/v1/models/ech%256F:predict"),
        ("GET", "/v1/models/ech%256F"),
        ("POST", "/models/ech%256F/invoke"),
        ("GET", "/v2/models/ech%256F/stats"),
    ):
        answer = cases.ask(bases, INFERENCE, method, path, b'{"instances": [1]}')
        assert answer["status"] == 404, (method, path, answer)
        assert "ech%6F" in str(answer["body"]), (method, path, answer)
    ready = httpx.get(f"{base}/v2/models/echo/versions/1%252E0/ready", timeout=60)
    assert ready.status_code == 404, ready.text


def test_an_empty_version_before_more_segments_is_asked_for(bases: dict[str, str]) -> None:
    """/predictions/echo//1.0 names the version "" (TorchServe: 404 'Model version:  does not
    exist'); torchbay ran the default version with 1.0 as the handler's url_path. A trailing
    slash (one or more) still means the default version, as Java's split drops it."""
    slashes = ("predictions_slash", "predictions_version_slash", "predictions_extra_segments")
    assert_as_torchserve(bases, ("predictions_empty_version", *slashes))
    answer = cases.ask(bases, INFERENCE, "POST", "/predictions/echo//", cases.BODY)
    assert (answer["status"], answer["body"]) == (200, {"bytes": len(cases.BODY)})


KSERVE = "torchbay serves KServe v1 and the Open Inference Protocol on these paths (TorchServe: \
its handler's raw input on any method, or no route)"
PROMETHEUS = "metrics_mode is prometheus by default (TorchServe's log mode: an empty page)"
OWN_DOCUMENT = "torchbay's own API description (its title, every route it serves)"
# case -> (torchbay's status, why): what torchbay answers otherwise on purpose (README's
# differences tables, and the tests above for the 405s).
DIFFERENCES: dict[str, tuple[int, str]] = {
    "options_root": (200, OWN_DOCUMENT),
    "get_api_description": (200, OWN_DOCUMENT),
    "options_management_root": (200, OWN_DOCUMENT),
    "options_metrics_root": (200, OWN_DOCUMENT),
    **{case: (200, PROMETHEUS) for case in ("metrics", "metrics_slash", "post_metrics")},
    **{case: (405, KSERVE) for case in NOT_ALLOWED},
    **{case: (200, KSERVE) for case in ("v1_model", "v2_ready", "v2_live", "v2_model")},
    **{case: (200, KSERVE) for case in ("v2_model_ready", "v2_server", "v1_predict")},
    **{case: (400, KSERVE + ": this body is no OIP request") for case in ("v2_infer",)},
    "v2_version_infer": (400, KSERVE + ": this body is no OIP request"),
    "post_explanations": (501, "a handler without explanations is a 501 (TorchServe: 503)"),
    "delete_explanations": (501, "a handler without explanations is a 501 (TorchServe: 503)"),
    "ping_more": (404, "/ping and /ping/ are health; a further segment is no route"),
    "predictions_no_model": (404, "the same 404, naming the empty model"),
}


@pytest.mark.parametrize("case", list(RECORDED))
def test_every_case_as_torchserve(bases: dict[str, str], case: str) -> None:
    """Every request of the record answered as TorchServe 0.12 answered it, but DIFFERENCES."""
    answer = ask(bases, case)
    if case in DIFFERENCES:
        assert answer["status"] == DIFFERENCES[case][0], answer
    else:
        assert comparable(answer) == comparable(RECORDED[case])


def test_a_management_405_names_every_method_of_the_path(bases: dict[str, str]) -> None:
    """Starlette's 405 names the methods of the first route of the path only: DELETE /models
    said ``Allow: GET`` though POST /models registers, so a client that retries with an allowed
    method never found registration (TorchServe sends no Allow; RFC 9110 wants them all)."""
    base = bases["management"]
    assert_as_torchserve(bases, ("delete_models_root", "options_management_models", "head_models"))
    for method, path, allow in (
        ("DELETE", "/models", "GET, POST"),
        ("PATCH", "/models/echo", "DELETE, GET, OPTIONS, PUT"),
        ("POST", "/models/echo/1.0", "DELETE, GET, OPTIONS, PUT"),
        ("GET", "/models/echo/1.0/set-default", "PUT"),
        ("PUT", "/workflows/w", "DELETE, GET"),  # TorchServe's 405: no workflow is scaled
    ):
        answer = httpx.request(method, base + path, timeout=60)
        assert (answer.status_code, answer.headers.get("allow")) == (405, allow), (method, path)
