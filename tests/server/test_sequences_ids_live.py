"""Sequence ids on a real server that the worker could not be told as they are
(plane/sequence_params.py): an id travels to the worker as TorchServe's header
``ts_request_sequence_id``, a Latin-1 header line, so an id of other characters is a 400 over
every protocol, before anything is queued. TorchServe's stateful example handler (its running
total per sequence id, in its worker) on one worker, as in test_sequences_live.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from .conftest import ASSETS, LiveServer, make_config, oip_client, tiny_archive
from .stateful_store import EXAMPLE, archive
from .test_grpc import ts  # noqa: F401  (the fixture: stubs generated from TorchServe's protos)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("seq-ids-store")
    work = tmp_path_factory.mktemp("seq-ids-build")
    config = work / "one.yaml"
    shutil.copy(EXAMPLE / "sequence_batching" / "model-config.yaml", config)
    with config.open("a") as f:
        f.write("sequenceMaxIdleMSec: 60000\nminWorkers: 1\nmaxWorkers: 1\n")
    archive(root, work, "stateful", config)
    gates = (str(ASSETS / "gates.py"),)  # a model without sequences
    tiny_archive(work, root, "plain", str(ASSETS / "probe_handler.py"), extra_files=gates)
    counter = work / "counter.yaml"  # the same handler without sequences: it reads no id
    counter.write_text("minWorkers: 1\nmaxWorkers: 1\nhandler:\n  cache:\n    capacity: 4\n")
    archive(root, work, "counter", counter)
    live = LiveServer(make_config(root, load_models=["all"])).start()
    try:
        yield live
    finally:
        live.stop()


def _grpc_infer(client, sequence_id: str, value: bytes, start: bool = False) -> int:
    data = triton_grpc.InferInput("data", [1], "BYTES")
    data.set_data_from_numpy(np.array([value], dtype=object))
    result = client.infer(
        "stateful", [data], sequence_id=sequence_id, sequence_start=start, client_timeout=30
    )
    return int(result.as_numpy("output0").reshape(-1)[0])


def test_a_grpc_id_beyond_latin_1_is_refused_and_the_model_serves_on(server) -> None:
    """Was: no answer, ever, and the model's worker slot stopped taking batches (its dispatch
    task died on a UnicodeEncodeError), so every later request hung too."""
    with oip_client(server, "grpc") as client:
        with pytest.raises(InferenceServerException) as info:
            _grpc_infer(client, "日本語", b"7", start=True)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "sequence_id" in info.value.message() and "Latin-1" in info.value.message()
        assert _grpc_infer(client, "after", b"3", start=True) == 3
        assert _grpc_infer(client, "after", b"4") == 7


def test_two_http_ids_beyond_latin_1_are_not_one_state(server) -> None:
    """Was: both reached the handler as "??", so the second sequence's start answered 110."""
    url = f"{server.url}/v2/models/stateful/infer"
    for sequence_id in ("日本", "中国"):
        body = {
            "inputs": [{"name": "data", "datatype": "BYTES", "shape": [1], "data": ["10"]}],
            "parameters": {"sequence_id": sequence_id, "sequence_start": True},
        }
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == 400 and "Latin-1" in r.json()["error"], r.text


def test_a_ts_grpc_id_beyond_latin_1_to_a_plain_model_is_answered(server, ts) -> None:  # noqa: F811
    """A model without sequences reads no id, but the request still carries TorchServe's
    header to the worker. Was: as for the model above, no answer and a worker slot that took
    no batch again."""
    channel = grpc.insecure_channel(f"127.0.0.1:{server.server.state.ports.grpc_inference}")
    try:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        for sequence_id in ("日本語", "plain"):
            request = ts.inference_pb2.PredictionsRequest(
                model_name="plain", sequence_id=sequence_id, input={"body": b"{}"}
            )
            assert b'"logits"' in stub.Predictions(request, timeout=30).prediction
    finally:
        channel.close()


BAD_SEQUENCE_PARAMETERS = (
    ({"sequence_id": -1}, "sequence_id"),
    ({"sequence_id": 1 << 64}, "sequence_id"),
    ({"sequence_id": 1.5}, "sequence_id"),
    ({"sequence_id": True}, "sequence_id"),
    ({"sequence_id": [1]}, "sequence_id"),
    ({"sequence_id": 5, "sequence_start": "yes"}, "sequence_start"),
    ({"sequence_end": 1}, "sequence_end"),
)


def test_a_model_without_sequences_refuses_sequence_parameters_of_the_wrong_type(server) -> None:
    """Triton's frontends parse sequence_id (a uint64 or a string), sequence_start and
    sequence_end (booleans) for every model, and refuse another type (400, INVALID_ARGUMENT);
    a model without sequences then ignores them. Was: any value was taken and ignored (-1,
    1.5, true, "yes": 200)."""
    url = f"{server.url}/v2/models/counter/infer"
    data = [{"name": "data", "datatype": "BYTES", "shape": [1], "data": ["1"]}]
    for params, name in BAD_SEQUENCE_PARAMETERS:
        r = httpx.post(url, json={"inputs": data, "parameters": params}, timeout=60)
        assert r.status_code == 400 and name in r.json()["error"], (params, r.text)
    for params in ({"sequence_id": 0}, {"sequence_id": ""}, {"sequence_id": (1 << 64) - 1}):
        params |= {"sequence_start": True, "sequence_end": False}
        r = httpx.post(url, json={"inputs": data, "parameters": params}, timeout=60)
        assert r.status_code == 200, (params, r.text)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.server.state.ports.grpc_inference}")
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="counter")
        request.inputs.add(name="data", datatype="BYTES", shape=[1])
        request.raw_input_contents.append(len(b"1").to_bytes(4, "little") + b"1")
        request.parameters["sequence_id"].double_param = 1.5
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sequence_id" in (info.value.details() or "")
        request.parameters["sequence_id"].string_param = "any"
        assert stub.ModelInfer(request, timeout=60).outputs[0].name == "output0"
    finally:
        channel.close()
