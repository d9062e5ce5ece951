"""Triton's trace extension on a real server: the settings over REST (httpx, tritonclient.http)
and gRPC (tritonclient.grpc) with Triton's names, values and error texts, a model's settings
falling back to the global ones and cleared by null, and the traces themselves: Triton's trace
JSON in ``trace_file.<k>`` after real requests over each protocol, ``trace_rate`` and
``trace_count`` honoured, and a trace file that cannot be written logged while every request is
still answered."""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from .conftest import running

pytestmark = pytest.mark.slow
DEADLINE_S = 60.0
STAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"]
CLEAR = {k: None for k in ("trace_level", "trace_rate", "trace_count", "log_frequency")}


@pytest.fixture(scope="module")
def traced(oip_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("traces") / "out"
    folder.mkdir()
    path = folder / "trace.json"
    with running(oip_store, load_models=["one.mar"], trace_file=str(path)) as live:
        grpc_url = f"127.0.0.1:{live.server.state.ports.grpc_inference}"
        http = triton_http.InferenceServerClient(live.url.removeprefix("http://"))
        grpc = triton_grpc.InferenceServerClient(grpc_url)
        yield SimpleNamespace(live=live, path=path, http=http, grpc=grpc)
        http.close()
        grpc.close()


@pytest.fixture
def server(traced: SimpleNamespace) -> Iterator[SimpleNamespace]:
    """The module's server, its trace settings put back to the start-up ones after the test."""
    yield traced
    traced.path.parent.mkdir(exist_ok=True)
    traced.http.update_trace_settings(model_name="one", settings=CLEAR)
    traced.http.update_trace_settings(settings=CLEAR)


def _infer_http(server: SimpleNamespace, n: int) -> None:
    for _ in range(n):
        tensor = triton_http.InferInput("input0", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 64), dtype=np.float32))
        server.http.infer("one", [tensor])


def _infer_grpc(server: SimpleNamespace, n: int) -> None:
    for _ in range(n):
        tensor = triton_grpc.InferInput("input0", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 64), dtype=np.float32))
        server.grpc.infer("one", [tensor])


def _infer_torchserve(server: SimpleNamespace, n: int) -> None:
    for _ in range(n):
        r = httpx.post(f"{server.live.url}/predictions/one", content=bytes(256))
        assert r.status_code == 200, r.text


INFER = {"http": _infer_http, "grpc": _infer_grpc, "predictions": _infer_torchserve}


def _index_files(path: Path) -> set[Path]:
    return set(path.parent.glob(path.name + ".*"))


def _new_file(path: Path, before: set[Path]) -> Path:
    """The one index file written since ``before`` (the writer thread writes it soon after)."""
    end = time.monotonic() + DEADLINE_S
    while not (new := _index_files(path) - before):
        assert time.monotonic() < end, "no trace file was written"
        time.sleep(0.02)
    (found,) = new
    while True:  # written whole by one write: a partial read fails to parse
        try:
            json.loads(found.read_text())
            return found
        except ValueError:
            assert time.monotonic() < end, f"{found.name} never became valid JSON"
            time.sleep(0.02)


def _check_traces(traces: list[dict]) -> None:
    for trace in traces:
        assert trace["model_name"] == "one" and trace["model_version"] == "1.0"
        assert isinstance(trace["id"], int)
        names = [t["name"] for t in trace["timestamps"]]
        assert names == STAMPS
        times = [t["ns"] for t in trace["timestamps"]]
        assert times == sorted(times) and times[0] > 0
    assert len({t["id"] for t in traces}) == len(traces)


# -- settings ------------------------------------------------------------------------------------


def test_defaults_and_the_extension_in_server_metadata(server: SimpleNamespace) -> None:
    expected = {
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": str(server.path),
        "trace_mode": "triton",
    }
    assert server.http.get_trace_settings() == expected
    assert server.http.get_trace_settings(model_name="one") == expected
    got = server.grpc.get_trace_settings(as_json=True)["settings"]
    assert {k: v["value"] for k, v in got.items()} == {
        k: v if isinstance(v, list) else [v] for k, v in expected.items()
    }
    assert "trace" in server.http.get_server_metadata()["extensions"]
    assert "trace" in server.grpc.get_server_metadata(as_json=True)["extensions"]


BAD = [
    ({"trace_rate": "abc"}, "Unable to parse 'trace_rate', got: abc"),
    ({"trace_rate": "-1"}, "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ]"),
    ({"log_frequency": "x1"}, "Unable to parse 'log_frequency', got: x1"),
    ({"trace_count": "-2"}, "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
    ({"trace_count": "9999999999"}, "value is out of range [ -1, 2147483647 ]"),
    ({"trace_rate": "9" * 5000}, "value is out of range [ 0, 4294967295 ]"),  # int() refuses
    ({"trace_count": "-" + "9" * 5000}, "Expecting value >= -1"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
    ({"trace_level": ["TENSORS"]}, "TENSORS is not supported"),
    ({"trace_level": ["LOUD"]}, "Unknown trace_level 'LOUD'"),
    ({"trace_file": "/tmp/elsewhere.json"}, "trace file location can not be updated"),
    ({"trace_mode": "opentelemetry"}, "Unsupported trace_mode"),
    ({"trace_verbosity": "1"}, "Unknown trace setting(s) ['trace_verbosity']"),
    ({"trace_rate": 5}, "Unable to parse 'trace_rate', expect a string"),
    ({"trace_level": ["TIMESTAMPS"], "trace_rate": "0"}, "sample rate must be non-zero"),
]


@pytest.mark.parametrize(("body", "text"), BAD)
def test_bad_settings_are_400_with_triton_text(server: SimpleNamespace, body, text) -> None:
    before = server.http.get_trace_settings()
    for url in ("/v2/trace/setting", "/v2/models/one/trace/setting"):
        r = httpx.post(server.live.url + url, json=body)
        assert r.status_code == 400, r.text
        assert text in r.json()["error"]
    assert server.http.get_trace_settings() == before  # nothing changed
    if all(isinstance(v, str | list) for v in body.values()):  # what gRPC can carry
        with pytest.raises(InferenceServerException) as err:
            server.grpc.update_trace_settings(settings=body)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert text in err.value.message()


def test_the_management_key_and_a_trace_file_are_needed(oip_store: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key_file.json"
    with running(oip_store, disable_token_authorization=False, key_file=key_file) as live:
        keys = json.loads(key_file.read_text())
        mgmt = {"Authorization": f"Bearer {keys['management']['key']}"}
        inference = {"Authorization": f"Bearer {keys['inference']['key']}"}
        url = f"{live.url}/v2/trace/setting"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers=inference).status_code == 401
        assert httpx.get(url, headers=mgmt).json()["trace_file"] == ""  # no trace_file set
        grpc = triton_grpc.InferenceServerClient(
            f"127.0.0.1:{live.server.state.ports.grpc_inference}"
        )
        try:
            with pytest.raises(InferenceServerException) as err:
                grpc.get_trace_settings(headers={"authorization": inference["Authorization"]})
            assert err.value.status() == "StatusCode.PERMISSION_DENIED"
            got = grpc.get_trace_settings(headers={"authorization": mgmt["Authorization"]})
            assert list(got.settings["trace_level"].value) == ["OFF"]
        finally:
            grpc.close()
        r = httpx.post(url, json={"trace_level": ["TIMESTAMPS"]}, headers=mgmt)
        assert r.status_code == 400
        assert r.json()["error"] == (
            "Attempting to set invalid trace setting :trace file name is not given"
        )


def test_unknown_model_and_bad_json(server: SimpleNamespace) -> None:
    r = httpx.get(f"{server.live.url}/v2/models/nope/trace/setting")
    assert r.status_code == 400 and r.json() == {"error": "Request for unknown model : nope"}
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
        server.grpc.get_trace_settings(model_name="nope")
    r = httpx.post(f"{server.live.url}/v2/trace/setting", content=b"{nope")
    assert r.status_code == 400 and "Traceback" not in r.text


def test_a_model_overrides_some_settings_and_null_clears_them(server: SimpleNamespace) -> None:
    http, grpc = server.http, server.grpc
    got = http.update_trace_settings(model_name="one", settings={"trace_rate": "5"})
    assert got["trace_rate"] == "5" and got["trace_count"] == "-1"
    assert http.get_trace_settings()["trace_rate"] == "1000"  # the global one is untouched
    # A global change reaches the model's settings it does not override, not the others.
    http.update_trace_settings(settings={"trace_count": "7", "trace_rate": "9"})
    model = http.get_trace_settings(model_name="one")
    assert (model["trace_rate"], model["trace_count"]) == ("5", "7")
    # gRPC: no value clears the model's setting: it falls back to the global one.
    got = grpc.update_trace_settings(model_name="one", settings={"trace_rate": None}, as_json=True)
    assert got["settings"]["trace_rate"]["value"] == ["9"]
    http.update_trace_settings(settings={"trace_rate": None, "trace_count": None})
    assert http.get_trace_settings(model_name="one")["trace_rate"] == "1000"


# -- traces --------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", list(INFER))
def test_each_request_is_traced_every_log_frequency(server: SimpleNamespace, protocol) -> None:
    infer = INFER[protocol]
    before = _index_files(server.path)
    server.http.update_trace_settings(
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "3"}
    )
    infer(server, 3)
    first = _new_file(server.path, before)
    traces = json.loads(first.read_text())
    assert len(traces) == 3
    _check_traces(traces)
    infer(server, 3)  # the next three: the next index file
    second = _new_file(server.path, before | {first})
    assert int(second.suffix[1:]) == int(first.suffix[1:]) + 1
    assert len(json.loads(second.read_text())) == 3


def test_rate_and_count(server: SimpleNamespace) -> None:
    before = _index_files(server.path)
    settings = {"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "2"}
    server.http.update_trace_settings(model_name="one", settings=settings)
    _infer_http(server, 3)
    _infer_grpc(server, 3)  # requests 2 and 4 traced; then the count is used up
    # The count used up writes the traces taken to an index file, as Triton does.
    traces = json.loads(_new_file(server.path, before).read_text())
    assert len(traces) == 2
    _check_traces(traces)
    assert server.http.get_trace_settings(model_name="one")["trace_count"] == "0"
    # Nothing more was written: the next file (a new setting's one trace) is the next one.
    seen = _index_files(server.path)
    server.http.update_trace_settings(
        model_name="one", settings={"trace_rate": "1", "trace_count": "1"}
    )
    _infer_http(server, 1)
    assert len(json.loads(_new_file(server.path, seen).read_text())) == 1
    assert len(_index_files(server.path)) == len(before) + 2


def test_held_traces_go_to_the_trace_file_when_the_setting_changes(
    server: SimpleNamespace,
) -> None:
    server.path.unlink(missing_ok=True)
    server.http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    _infer_grpc(server, 2)  # log_frequency 0: held, as Triton holds them
    server.http.update_trace_settings(settings={"trace_level": ["OFF"]})
    end = time.monotonic() + DEADLINE_S
    while (traces := _open_array(server.path)) is None:
        assert time.monotonic() < end, "the held traces were never written"
        time.sleep(0.02)
    assert len(traces) == 2
    _check_traces(traces)


def _open_array(path: Path) -> list[dict] | None:
    """The traces of a trace file whose array is still open (it closes when the server stops);
    None until its whole first write is there."""
    try:
        return json.loads(path.read_text() + "]")
    except (OSError, ValueError):
        return None


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_an_unwritable_trace_file_is_logged_and_requests_are_answered(
    server: SimpleNamespace,
) -> None:
    shutil.rmtree(server.path.parent)  # the trace file's folder is gone
    records = _Records()
    logger = logging.getLogger("torchbay.trace")
    logger.addHandler(records)
    try:
        server.http.update_trace_settings(
            settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"}
        )
        _infer_http(server, 2)  # tritonclient raises on anything but a 200
        _infer_grpc(server, 2)
        end = time.monotonic() + DEADLINE_S
        while len(records.messages) < 4:
            assert time.monotonic() < end, records.messages
            time.sleep(0.02)
    finally:
        logger.removeHandler(records)
    assert all(m.startswith("could not write traces to ") for m in records.messages)
    assert not server.path.parent.exists()
