"""The gRPC listeners against a real server: tritonclient.grpc (in-process), the kserve SDK's
InferenceGRPCClient (in a child process: it cannot share one with tritonclient), and a client
generated at test time from TorchServe's own .proto files. Token auth is on: every call carries
``authorization: Bearer <key>`` metadata, as a TorchServe gRPC client does."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from torchbay.server.grpc import messages

from .conftest import LiveServer, build_store, make_config

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
HANDLER = str(CLIENTS / "grpc_handler.py")


@pytest.fixture(scope="module")
def ts(ts_stubs: SimpleNamespace) -> SimpleNamespace:
    return ts_stubs


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory, "grpc-store", {"echo": HANDLER, "batched": HANDLER})


MODELS = {
    "echo": {"1.0": {"marName": "echo.mar", "defaultVersion": True}},
    # Batches of 8 that wait up to 20 s to fill: the HTTP + gRPC mix must share them.
    "batched": {"1.0": {"marName": "batched.mar", "batchSize": 8, "maxBatchDelay": 20000}},
}


@pytest.fixture(scope="module")
def server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    key_file = tmp_path_factory.mktemp("grpc-keys") / "key_file.json"
    config = make_config(store, models=MODELS, enable_model_api=True,
                         disable_token_authorization=False, key_file=key_file)  # fmt: skip
    live = LiveServer(config).start()
    keys = json.loads(key_file.read_text())
    ports = live.server.state.ports
    inference = grpc.insecure_channel(f"127.0.0.1:{ports.grpc_inference}")
    management = grpc.insecure_channel(f"127.0.0.1:{ports.grpc_management}")
    try:
        yield SimpleNamespace(
            live=live,
            ports=ports,
            inference=inference,
            management=management,
            ikey=[("authorization", f"Bearer {keys['inference']['key']}")],
            mkey=[("authorization", f"Bearer {keys['management']['key']}")],
        )
    finally:
        inference.close()
        management.close()
        live.stop()


def _predict(server: SimpleNamespace, ts: SimpleNamespace, model: str, body: Any, **kw: Any):
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.inference)
    request = ts.inference_pb2.PredictionsRequest(
        model_name=model, model_version=kw.pop("version", ""), input={"data": json.dumps(body)
                                                                       .encode()}
    )  # fmt: skip
    return stub.Predictions(request, metadata=kw.pop("metadata", server.ikey), **kw)


def _error(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


# -- the KServe v2 service ------------------------------------------------------------------------


def test_triton_client_health_and_metadata(server: SimpleNamespace) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{server.ports.grpc_inference}")
    headers = dict(server.ikey)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("echo", headers=headers)
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "torchbay" and meta["version"]
    model = client.get_model_metadata("echo", headers=headers, as_json=True)
    assert model["name"] == "echo" and model["versions"] == ["1.0"]
    for call in (lambda: client.is_model_ready("nope", headers=headers),
                 lambda: client.get_model_metadata("nope", headers=headers)):  # fmt: skip
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == "StatusCode.NOT_FOUND"
        assert "nope" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.is_model_ready("echo")  # no key: as REST, model routes need the inference key
    assert info.value.status() == "StatusCode.PERMISSION_DENIED"
    assert "Token authorization failed" in info.value.message()
    client.close()


def test_triton_infer_errors_are_statuses_with_clear_messages(server: SimpleNamespace) -> None:
    import numpy as np

    client = triton.InferenceServerClient(f"127.0.0.1:{server.ports.grpc_inference}")
    tensor = triton.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 2), dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [tensor], headers=dict(server.ikey))
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert info.value.message() == "Model not found: nope" or "nope" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.infer("echo", [tensor])
    assert info.value.status() == "StatusCode.PERMISSION_DENIED"
    client.close()


def test_typed_contents_the_protocol_cannot_pack_are_invalid_argument(server) -> None:
    request_type, response_type, *_ = messages.method_types(messages.OIP_SERVICE, "ModelInfer")
    infer = server.inference.unary_unary(
        f"/{messages.OIP_SERVICE}/ModelInfer",
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString,
    )
    request = request_type(model_name="echo")
    request.inputs.add(name="h", datatype="FP16", shape=[1])
    error = _error(lambda: infer(request, metadata=server.ikey, timeout=30))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "needs raw_input_contents" in error.details()


def test_model_stream_infer_answers_errors_in_the_stream(server: SimpleNamespace) -> None:
    import numpy as np

    client = triton.InferenceServerClient(f"127.0.0.1:{server.ports.grpc_inference}")
    results: asyncio.Queue | list = []
    client.start_stream(callback=lambda result, error: results.append((result, error)),
                        headers=dict(server.ikey))  # fmt: skip
    tensor = triton.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    for i in range(2):
        client.async_stream_infer("nope", [tensor], request_id=f"r{i}")
    client.stop_stream()  # waits for the stream to end: every answer has arrived
    assert len(results) == 2
    assert all(result is None and "nope" in error.message() for result, error in results)
    client.close()


def test_kserve_sdk_client_in_a_child_process(server: SimpleNamespace) -> None:
    key = server.ikey[0][1].removeprefix("Bearer ")
    url = f"127.0.0.1:{server.ports.grpc_inference}"
    out = subprocess.run([sys.executable, str(CLIENTS / "kserve_client.py"), url, key, "echo"],
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["live"] is True and result["ready"] is True and result["model_ready"] is True
    assert (
        result["unknown"]["code"] == "NOT_FOUND" and "no-such-model" in result["unknown"]["details"]
    )
    assert result["no_key"]["code"] == "PERMISSION_DENIED"
    assert result["infer_unknown"]["code"] == "NOT_FOUND"


# -- TorchServe's inference service ---------------------------------------------------------------


def test_predictions_give_the_handler_torchserve_rows(server, ts) -> None:
    reply = _predict(server, ts, "echo", {"echo": "hi"}, timeout=60)
    answer = json.loads(reply.prediction)
    assert answer == {"batch": 1, "echo": "hi", "keys": ["data"]}
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.inference)
    request = ts.inference_pb2.PredictionsRequest(
        model_name="echo", model_version="1.0",
        input={"data": b'{"echo": 2}', "extra": b"\xff\x00raw bytes"},
    )  # fmt: skip
    answer = json.loads(stub.Predictions(request, metadata=server.ikey, timeout=60).prediction)
    assert answer["keys"] == ["data", "extra"] and answer["echo"] == 2
    health = stub.Ping(__import__("google.protobuf.empty_pb2").protobuf.empty_pb2.Empty())
    assert json.loads(health.health) == {"status": "Healthy"}


def test_stream_predictions_with_a_one_part_handler(server, ts) -> None:
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.inference)
    request = ts.inference_pb2.PredictionsRequest(model_name="echo", input={"data": b'{"echo":3}'})
    parts = list(stub.StreamPredictions(request, metadata=server.ikey, timeout=60))
    assert [json.loads(p.prediction)["echo"] for p in parts] == [3]


def test_stream_predictions2_answers_each_request_and_carries_errors_in_status(server, ts) -> None:
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.inference)
    bodies = [b'{"echo": "a"}', b'{"bad": true}', b'{"echo": "c"}']
    requests = iter(
        ts.inference_pb2.PredictionsRequest(model_name="echo", input={"data": body},
                                            sequence_id=f"s{i}")
        for i, body in enumerate(bodies)
    )  # fmt: skip
    replies = list(stub.StreamPredictions2(requests, metadata=server.ikey, timeout=60))
    assert [r.sequence_id for r in replies] == ["s0", "s1", "s2"]
    assert json.loads(replies[0].prediction)["echo"] == "a"
    assert json.loads(replies[2].prediction)["echo"] == "c"
    assert replies[1].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert replies[1].status.message == "this item was marked bad"
    assert not replies[1].prediction


def test_stream_predictions2_refuses_a_request_without_a_sequence_id(server, ts) -> None:
    """As TorchServe 0.12's InferenceImpl: a StreamPredictions2 request with neither a
    sequence id nor a start flag is answered "Parameter sequenceId is required." in the
    stream, which goes on. Was: run as a sequence the server named."""
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.inference)
    request = ts.inference_pb2.PredictionsRequest
    requests = [
        request(model_name="echo", input={"data": b'{"echo": "a"}'}),
        request(model_name="echo", input={"data": b'{"echo": "b"}'}, sequence_id="s1"),
    ]
    replies = list(stub.StreamPredictions2(iter(requests), metadata=server.ikey, timeout=60))
    assert len(replies) == 2 and not replies[0].prediction
    assert replies[0].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert replies[0].status.message == "Parameter sequenceId is required."
    assert json.loads(replies[1].prediction)["echo"] == "b"


@pytest.mark.parametrize(
    ("model", "body", "code", "words"),
    [
        ("nope", {}, grpc.StatusCode.NOT_FOUND, "Model not found: nope"),
        ("echo", {"bad": True}, grpc.StatusCode.INVALID_ARGUMENT, "this item was marked bad"),
        ("echo", [1], grpc.StatusCode.INVALID_ARGUMENT, "wants a JSON object"),
        ("echo", {"boom": True}, grpc.StatusCode.INTERNAL, "RuntimeError"),
    ],
)
def test_prediction_errors_are_the_mapped_status_with_the_message(
    server, ts, model, body, code, words
) -> None:
    error = _error(lambda: _predict(server, ts, model, body, timeout=60))
    assert error.code() is code
    assert words in error.details()
    assert "/secret" not in error.details() and "Traceback" not in error.details()


def test_unknown_version_and_bad_input_keys(server, ts) -> None:
    error = _error(lambda: _predict(server, ts, "echo", {}, version="9.9", timeout=60))
    assert error.code() is grpc.StatusCode.NOT_FOUND and "9.9" in error.details()
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.inference)
    request = ts.inference_pb2.PredictionsRequest(model_name="echo", input={'a"b': b"{}"})
    error = _error(lambda: stub.Predictions(request, metadata=server.ikey, timeout=60))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and "input key" in error.details()


def test_auth_on_every_grpc_service(server, ts) -> None:
    """A call without a valid key is PERMISSION_DENIED on every service, as TorchServe 0.12's
    GRPCInterceptor closes it (not UNAUTHENTICATED, REST's 401)."""
    cases = [
        lambda: _predict(server, ts, "echo", {}, metadata=None, timeout=30),
        lambda: _predict(server, ts, "echo", {}, metadata=server.mkey, timeout=30),
        lambda: _predict(server, ts, "echo", {}, metadata=[("authorization", "Bearer x")]),
        lambda: ts.management_pb2_grpc.ManagementAPIsServiceStub(server.management).ListModels(
            ts.management_pb2.ListModelsRequest(), metadata=server.ikey, timeout=30
        ),
    ]
    for call in cases:
        error = _error(call)
        assert error.code() is grpc.StatusCode.PERMISSION_DENIED
        assert error.details().startswith("Token authorization failed")


def test_a_request_whose_deadline_passes_in_the_queue_never_runs(server, ts) -> None:
    mv = server.live.server.registry.resolve("echo")
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.inference)
    slow = stub.Predictions.future(
        ts.inference_pb2.PredictionsRequest(
            # 4 s: the late request's 0.3 s deadline passes while this one runs even if the
            # loaded host stalls this test for seconds between the two
            model_name="echo",
            input={"data": b'{"sleep": 4, "echo": "slow"}'},
        ),
        metadata=server.ikey,
        timeout=60,
    )
    _wait_for(lambda: (mv.inflight == 1 and len(mv.queue) == 0) or slow.done())
    error = _error(lambda: _predict(server, ts, "echo", {"echo": "late"}, timeout=0.3))
    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert json.loads(slow.result().prediction)["echo"] == "slow"
    ran = json.loads(_predict(server, ts, "echo", {"ran": True}, timeout=60).prediction)["ran"]
    assert "slow" in ran and "late" not in ran


def _wait_for(condition: Any, timeout: float = 30.0) -> None:
    import time

    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.01)


def test_http_and_grpc_requests_share_one_batch(server, ts) -> None:
    """Four HTTP and four gRPC requests to a batch-of-8 model land in the same batch."""

    async def run() -> list[dict]:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}")
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        headers = dict(server.ikey)
        async with httpx.AsyncClient(base_url=server.live.url, timeout=60) as http:

            async def over_http(i: int) -> dict:
                response = await http.post("/predictions/batched", json={"echo": f"h{i}"},
                                           headers=headers)  # fmt: skip
                assert response.status_code == 200, response.text
                return response.json()

            async def over_grpc(i: int) -> dict:
                request = ts.inference_pb2.PredictionsRequest(
                    model_name="batched", input={"data": json.dumps({"echo": f"g{i}"}).encode()}
                )
                reply = await stub.Predictions(request, metadata=server.ikey, timeout=60)
                return json.loads(reply.prediction)

            jobs = [over_http(i) for i in range(4)] + [over_grpc(i) for i in range(4)]
            answers = await asyncio.gather(*jobs)
        await channel.close()
        return answers

    answers = asyncio.run(run())
    assert sorted(a["echo"] for a in answers) == [f"g{i}" for i in range(4)] + [
        f"h{i}" for i in range(4)
    ]
    assert [a["batch"] for a in answers] == [8] * 8
    assert {tuple(a["keys"]) for a in answers} == {("body",), ("data",)}  # both protocols
    # gRPC requests are counted with the HTTP ones (metrics and access log: one RequestHook).
    metrics = httpx.get(f"{server.live.metrics_url}/metrics", timeout=30).text
    counted = [
        line
        for line in metrics.splitlines()
        if line.startswith("torchbay_requests_total{") and 'model="batched"' in line
    ]
    assert len(counted) == 1 and 'code="200"' in counted[0] and counted[0].endswith(" 8.0")


# -- TorchServe's management service --------------------------------------------------------------


def test_management_rpcs_answer_what_the_http_api_answers(server, ts) -> None:
    stub = ts.management_pb2_grpc.ManagementAPIsServiceStub(server.management)
    pb, key = ts.management_pb2, server.mkey
    http = httpx.Client(base_url=server.live.management_url, headers=dict(key), timeout=60)
    listed = stub.ListModels(pb.ListModelsRequest(), metadata=key, timeout=30).msg
    assert listed == http.get("/models").text
    assert json.loads(stub.ListModels(pb.ListModelsRequest(limit=1), metadata=key).msg) == {
        "models": [{"modelName": "batched", "modelUrl": "batched.mar"}], "nextPageToken": "1"
    }  # fmt: skip
    described = json.loads(stub.DescribeModel(pb.DescribeModelRequest(model_name="echo"),
                                              metadata=key, timeout=30).msg)  # fmt: skip
    assert described[0]["modelName"] == "echo" and described[0]["modelVersion"] == "1.0"
    # TorchServe's msg: describe and list as JSON text, the others as the status message alone.
    msg = stub.SetDefault(pb.SetDefaultRequest(model_name="echo", model_version="1.0"),
                          metadata=key, timeout=30).msg  # fmt: skip
    assert msg == http.put("/models/echo/1.0/set-default").json()["status"]
    msg = stub.ScaleWorker(pb.ScaleWorkerRequest(model_name="echo", min_worker=1,
                                                 synchronous=True), metadata=key).msg  # fmt: skip
    assert msg == "Workers scaled to 1 for model: echo"
    registered = stub.RegisterModel(
        pb.RegisterModelRequest(url="echo.mar", model_name="echo_copy", initial_workers=1,
                                synchronous=True), metadata=key, timeout=120,
    ).msg  # fmt: skip
    assert registered == 'Model "echo_copy" Version: 1.0 registered with 1 initial workers'
    gone = stub.UnregisterModel(pb.UnregisterModelRequest(model_name="echo_copy"),
                                metadata=key, timeout=120).msg  # fmt: skip
    assert gone == 'Model "echo_copy" unregistered'
    http.close()


@pytest.mark.parametrize(
    ("rpc", "request_args", "code", "words"),
    [
        ("DescribeModel", {"model_name": "nope"}, grpc.StatusCode.NOT_FOUND, "nope"),
        ("ScaleWorker", {"model_name": "echo", "min_worker": 3, "max_worker": 2},
         grpc.StatusCode.INVALID_ARGUMENT, "max_worker cannot be less than min_worker."),
        ("ScaleWorker", {"model_name": "echo", "min_worker": 100000},
         grpc.StatusCode.INVALID_ARGUMENT, "min_worker"),
        ("SetDefault", {"model_name": "echo", "model_version": "7"},
         grpc.StatusCode.NOT_FOUND, "7"),
        ("RegisterModel", {}, grpc.StatusCode.INVALID_ARGUMENT, "url is required"),
        ("RegisterModel", {"url": "missing.mar"}, grpc.StatusCode.NOT_FOUND,
         "missing.mar"),  # HTTP answers 404, as TorchServe does
        ("RegisterModel", {"url": "echo.mar", "model_name": "bad name!"},
         grpc.StatusCode.INVALID_ARGUMENT, "Invalid model name 'bad name!'"),
        ("RegisterModel", {"url": "echo.mar", "model_name": "e2", "runtime": "java"},
         grpc.StatusCode.INVALID_ARGUMENT, "Invalid RuntimeType value: java"),  # as HTTP
        ("UnregisterModel", {"model_name": "nope"}, grpc.StatusCode.NOT_FOUND, "nope"),
    ],
)  # fmt: skip
def test_management_errors(server, ts, rpc, request_args, code, words) -> None:
    stub = ts.management_pb2_grpc.ManagementAPIsServiceStub(server.management)
    request = getattr(ts.management_pb2, f"{rpc}Request")(**request_args)
    error = _error(lambda: getattr(stub, rpc)(request, metadata=server.mkey, timeout=60))
    assert error.code() is code, error.details()
    assert words in error.details()
    assert "Traceback" not in error.details() and str(Path.cwd()) not in error.details()


# -- limits, the model API switch, start-up -------------------------------------------------------


def test_limits_model_api_off_and_a_taken_port(store: Path, server, ts) -> None:
    from torchbay.server.errors import TorchbayError

    config = make_config(store, models={"echo": MODELS["echo"]}, max_request_size=4096)
    live = LiveServer(config).start()
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{live.server.state.ports.grpc_inference}")
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        big = ts.inference_pb2.PredictionsRequest(model_name="echo", input={"data": bytes(8192)})
        error = _error(lambda: stub.Predictions(big, timeout=30))
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        manage = grpc.insecure_channel(f"127.0.0.1:{live.server.state.ports.grpc_management}")
        mstub = ts.management_pb2_grpc.ManagementAPIsServiceStub(manage)
        for call in (
            lambda: mstub.RegisterModel(ts.management_pb2.RegisterModelRequest(url="echo.mar")),
            lambda: mstub.UnregisterModel(ts.management_pb2.UnregisterModelRequest(
                model_name="echo")),
        ):  # fmt: skip
            error = _error(call)
            assert error.code() is grpc.StatusCode.PERMISSION_DENIED
            assert "Model API control is disabled" in error.details()
        channel.close()
        manage.close()
    finally:
        live.stop()
    taken = make_config(store, grpc_inference_port=server.ports.grpc_inference)
    with pytest.raises(
        TorchbayError, match=r"cannot listen on 127\.0\.0\.1:\d+ \(gRPC inference\)"
    ):
        LiveServer(taken).start()


def _self_signed(folder: Path) -> tuple[Path, Path]:
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        ), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_path, cert_path = folder / "key.pem", folder / "cert.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


def test_enable_grpc_ssl_serves_tls(tmp_path: Path) -> None:
    key, cert = _self_signed(tmp_path)
    config = make_config(tmp_path, enable_grpc_ssl=True, private_key_file=key,
                         certificate_file=cert)  # fmt: skip
    live = LiveServer(config).start()
    try:
        port = live.server.state.ports.grpc_inference
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        request_type, response_type, *_ = messages.method_types(messages.OIP_SERVICE, "ServerLive")
        with grpc.secure_channel(f"127.0.0.1:{port}", creds) as channel:
            call = channel.unary_unary(
                f"/{messages.OIP_SERVICE}/ServerLive",
                request_serializer=request_type.SerializeToString,
                response_deserializer=response_type.FromString,
            )
            assert call(request_type(), timeout=30).live is True
        with grpc.insecure_channel(f"127.0.0.1:{port}") as plain:  # plaintext is refused
            call = plain.unary_unary(
                f"/{messages.OIP_SERVICE}/ServerLive",
                request_serializer=request_type.SerializeToString,
                response_deserializer=response_type.FromString,
            )
            assert _error(lambda: call(request_type(), timeout=10)).code() is C_UNAVAILABLE
    finally:
        live.stop()


C_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def test_a_model_without_workers_is_unavailable(server, ts) -> None:
    http = httpx.Client(base_url=server.live.management_url, headers=dict(server.mkey), timeout=60)
    try:
        scaled = http.put("/models/echo", params={"min_worker": 0, "synchronous": "true"})
        assert scaled.status_code == 200, scaled.text
        error = _error(lambda: _predict(server, ts, "echo", {"echo": 1}, timeout=30))
        assert error.code() is grpc.StatusCode.UNAVAILABLE
        assert "has no worker" in error.details() and "scale workers API" in error.details()
    finally:
        http.put("/models/echo", params={"min_worker": 1, "synchronous": "true"})
        http.close()
    assert json.loads(_predict(server, ts, "echo", {"echo": 2}, timeout=60).prediction)["echo"] == 2
