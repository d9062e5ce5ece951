"""A handler author's mistakes on a live server (tests/server/assets/fault_handler.py): each is a
500 naming the handler's error for the request it touched, its batch mates get their answers, and
the same worker keeps serving."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from torchbay.handlers.metrics import MAX_DIMENSIONS, MAX_RECORDS, MAX_TEXT

from .conftest import ASSETS, build_store

MODEL = {"batchSize": 4, "maxBatchDelay": 300, "minWorkers": 1, "maxWorkers": 1}


@pytest.fixture(scope="module")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory, "faults", {"faults": str(ASSETS / "fault_handler.py")})


@pytest.fixture(scope="module")
def server(model_store: Path) -> Any:
    from .conftest import LiveServer, make_config

    models = {"faults": {"1.0": {"marName": "faults.mar", "defaultVersion": True, **MODEL}}}
    config = make_config(
        model_store, models=models, load_models=["faults.mar"], default_response_timeout_s=20
    )
    live = LiveServer(config).start()
    yield live
    live.stop()


def _batch(server: Any, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """``bodies`` posted at once (one batch, the model waits 300 ms to fill it)."""

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            posts = [client.post("/predictions/faults", json=b) for b in bodies]
            return list(await asyncio.gather(*posts))

    return asyncio.run(run())


def _pid(server: Any) -> int:
    r = httpx.post(f"{server.url}/predictions/faults", json={}, timeout=60)
    assert r.status_code == 200, r.text
    return int(r.json()["pid"])


def _post(server: Any, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/predictions/faults", json=body, timeout=120)


@pytest.mark.parametrize("name", ["KeyboardInterrupt", "GeneratorExit", "BaseException"])
def test_a_base_exception_from_handle_is_a_500_and_the_worker_keeps_serving(
    server: Any, name: str
) -> None:
    pid = _pid(server)
    bad, *good = _batch(server, [{"raise": name}, {}, {}, {}])
    assert bad.status_code == 500, bad.text
    assert bad.json()["type"] == name
    assert [(r.status_code, r.json()["pid"]) for r in good] == [(200, pid)] * 3
    assert _pid(server) == pid


@pytest.mark.parametrize("name", ["KeyboardInterrupt", "SystemExit"])
def test_a_stream_raising_a_base_exception_fails_alone(server: Any, name: str) -> None:
    pid = _pid(server)
    bad, *good = _batch(server, [{"stream_raise": name}, {}, {}, {}])
    assert bad.status_code == 200  # its first part went out before the error
    assert name in bad.text
    assert [(r.status_code, r.json()["pid"]) for r in good] == [(200, pid)] * 3
    assert _pid(server) == pid


def test_a_nan_or_infinite_counter_increment_is_dropped(server: Any) -> None:
    for value in (1, "nan", "inf", 2, "-inf"):
        r = httpx.post(
            f"{server.url}/predictions/faults", json={"metric": ["fault_count", value]}, timeout=60
        )
        assert r.status_code == 200, r.text
    assert _samples(server, "fault_count_total") == [3.0]  # not NaN or +Inf for good


def test_the_custom_metric_records_of_one_batch_are_bounded(server: Any) -> None:
    body = {"metric": ["fault_flood", 1], "times": 3 * MAX_RECORDS}
    r = httpx.post(f"{server.url}/predictions/faults", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert _samples(server, "fault_flood_total") == [float(MAX_RECORDS)]


def test_custom_metric_labels_are_bounded(server: Any) -> None:
    for value in ("short", "v" * (MAX_TEXT + 1)):
        body = {"metric": ["fault_labels", 1, {"input": value}]}
        assert _post(server, body).status_code == 200
    many = {f"d{i}": "1" for i in range(MAX_DIMENSIONS + 1)}
    assert _post(server, {"metric": ["fault_dims", 1, many]}).status_code == 200
    assert _samples(server, "fault_labels_total") == [1.0]  # the long value: no series
    assert _samples(server, "fault_dims_total") == []


def _samples(server: Any, name: str) -> list[float]:
    server.recorded()
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=60).text
    families = text_string_to_metric_families(text)
    return [s.value for family in families for s in family.samples if s.name == name]


def test_parts_sent_by_a_thread_after_the_handler_returned_break_nothing(server: Any) -> None:
    pid = _pid(server)
    assert _post(server, {"late_parts": 100}).status_code == 200
    answers = [_post(server, {"big": 1 << 20}) for _ in range(20)]
    assert [(r.status_code, r.json()["pid"]) for r in answers] == [(200, pid)] * 20


def test_more_header_bytes_than_a_client_reads_are_a_500(server: Any) -> None:
    few, many = _post(server, {"headers": 100}), _post(server, {"headers": 200})
    assert few.status_code == 200 and few.headers["x-fault-99"] == "v" * 100  # 11 KiB
    assert many.status_code == 500  # 22 KiB: past h11's and Node.js's default limits
    assert many.json()["message"] == "The model answered with too many HTTP header bytes"
    assert _pid(server) == few.json()["pid"]


@pytest.mark.parametrize("status", [201, 202])
def test_a_2xx_status_set_by_the_handler_is_a_success_over_oip_grpc(
    server: Any, status: int
) -> None:
    import numpy as np
    import tritonclient.grpc as triton

    x = triton.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
    client = triton.InferenceServerClient(f"127.0.0.1:{server.server.state.ports.grpc_inference}")
    with client:
        result = client.infer("faults", [x], headers={"x-fault-status": str(status)})
    assert result.as_numpy(result.get_response().outputs[0].name).ravel().tolist() == [1.0, 2.0]
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    headers = {"x-fault-status": str(status)}
    r = httpx.post(f"{server.url}/v2/models/faults/infer", json=body, headers=headers, timeout=60)
    assert r.status_code == status and r.json()["outputs"][0]["data"] == [1.0, 2.0]


@pytest.mark.parametrize("name", ["ts_inference_requests_total", "ts_inference_requests"])
def test_a_custom_metric_named_as_a_torchserve_family_is_refused(server: Any, name: str) -> None:
    assert _post(server, {"metric": [name, 5]}).status_code == 200
    server.recorded()
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=60).text
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(names) == len(set(names))  # one family per name: Prometheus takes the scrape


def test_a_status_that_is_no_http_answer_is_an_error_on_every_protocol(
    server: Any, ts_stubs: Any
) -> None:
    """A handler's 102: REST answers 500, and so both gRPC services answer INTERNAL (TorchServe's
    Predictions took it for a success, ModelInfer answered UNKNOWN)."""
    import grpc
    import numpy as np
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    headers = {"x-fault-status": "102"}
    r = httpx.post(f"{server.url}/predictions/faults", content=b"x", headers=headers, timeout=60)
    assert r.status_code == 500 and "invalid HTTP status" in r.json()["message"]
    port = server.server.state.ports.grpc_inference
    x = triton.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
    with (
        triton.InferenceServerClient(f"127.0.0.1:{port}") as client,
        pytest.raises(InferenceServerException, match="invalid HTTP status") as oip,
    ):
        client.infer("faults", [x], headers=headers)
    assert oip.value.status() == "StatusCode.INTERNAL"
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = ts_stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    request = ts_stubs.inference_pb2.PredictionsRequest(model_name="faults", input={"data": b"x"})
    with pytest.raises(grpc.RpcError) as predictions:
        stub.Predictions(request, metadata=tuple(headers.items()), timeout=60)
    channel.close()
    assert predictions.value.code() is grpc.StatusCode.INTERNAL
    assert "invalid HTTP status" in (predictions.value.details() or "")
