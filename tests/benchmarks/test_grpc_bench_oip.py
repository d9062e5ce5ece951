"""``torchbay bench run --protocol grpc-v2`` (benchmarks/grpc_pair.py): the OIP input tensor as
both routes carry it, and the HTTP v2 binary / gRPC ModelInfer pair against a real server started
from the benchmark's tiny archive."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from torchbay.benchmarks import cli, grpc_pair, models, runner
from torchbay.benchmarks.bench import RunOptions, open_server
from torchbay.benchmarks.errors import BenchError
from torchbay.handlers.runtime import oip
from torchbay.server.grpc import messages, tensors


@pytest.fixture(scope="module")
def tiny(assets: runner.Assets, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the benchmark's tiny archive, its raw float32 sample body)."""
    out = tmp_path_factory.mktemp("tiny-store")
    only = runner.Assets(pt={"tiny": assets.pt["tiny"]}, body={"tiny": assets.body["tiny"]})
    store = runner.archive_models(only, out, sys.executable).model_store
    assert store is not None
    return store / "tiny.mar", assets.body["tiny"]


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def _parsed(body: bytes, head_len: int) -> dict:
    return oip.parse_request(body, {oip.HEADER_LENGTH: str(head_len)})


def test_a_raw_file_is_one_bytes_element_the_raw_handler_reads_back(tmp_path: Path) -> None:
    raw = np.arange(64, dtype="<f4").tobytes()
    (tmp_path / "x.bin").write_bytes(raw)
    tensor = grpc_pair.load_tensor(tmp_path / "x.bin")
    body, head_len = tensor.http_body()
    request = _parsed(body, head_len)
    assert request["parameters"] == {"binary_data_output": True}
    assert [t["datatype"] for t in request["inputs"]] == ["BYTES"]
    assert oip.body_value(request) == raw  # what handler_raw.py gets as its body


def test_a_npy_tensor_is_the_same_over_http_and_model_infer(tmp_path: Path) -> None:
    array = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "x.npy", array)
    tensor = grpc_pair.load_tensor(tmp_path / "x.npy")
    assert (tensor.name, tensor.datatype, tensor.shape) == ("input0", "FP32", (3, 4))
    over_http = _parsed(*tensor.http_body())["inputs"][0]
    # the server's own conversion of the ModelInferRequest (what the worker gets over gRPC)
    over_grpc = _parsed(*tensors.request_body(tensor.grpc_request("m", "2")))["inputs"][0]
    for seen in (over_http, over_grpc):
        assert (seen["name"], seen["datatype"], seen["shape"]) == ("input0", "FP32", [3, 4])
        np.testing.assert_array_equal(seen["array"], array)
    np.save(tmp_path / "c.npy", np.zeros(2, dtype=np.complex64))
    with pytest.raises(BenchError, match="no OIP datatype"):
        grpc_pair.load_tensor(tmp_path / "c.npy")
    with pytest.raises(BenchError, match="cannot read"):
        grpc_pair.load_tensor(tmp_path / "missing.npy")


def test_an_archive_input_is_its_recorded_example(
    assets: runner.Assets, tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    """An archive packed with the built-in ``tensor`` handler and ``--example-input`` (one
    sample as a batch of 1) gives that example as the input tensor."""
    example = tmp_path / "tiny-example.npy"
    np.save(example, models.sample_tensor("tiny").numpy()[None])
    flags = ("--example-input", str(example), "--force")
    typed = runner.archive(
        "tiny", assets.pt["tiny"], tmp_path, sys.executable, *flags, handler="tensor"
    )
    tensor = grpc_pair.load_tensor(typed)
    assert (tensor.name, tensor.datatype, tensor.shape) == ("input0", "FP32", (1, 64))
    assert tensor.raw == tiny[1].read_bytes()  # the same sample as the raw body
    with pytest.raises(BenchError, match="records no one-tensor example"):
        grpc_pair.load_tensor(tiny[0])  # the raw-body archive records none
    (tmp_path / "junk.mar").write_bytes(b"not a zip")
    with pytest.raises(BenchError, match=r"junk\.mar"):
        grpc_pair.load_tensor(tmp_path / "junk.mar")


def test_grpc_v2_is_a_closed_loop_over_one_input(tmp_path: Path) -> None:
    body = tmp_path / "x.bin"
    body.write_bytes(bytes(256))
    rate = RunOptions(url="http://h:1", model="m", rate=5.0, inputs=(body,))
    with pytest.raises(BenchError, match="closed loop"):
        grpc_pair.run_grpc_bench(rate, oip=True)
    two = RunOptions(url="http://h:1", model="m", concurrency=1, inputs=(body, body))
    with pytest.raises(BenchError, match="one --input"):
        grpc_pair.run_grpc_bench(two, oip=True)
    with pytest.raises(SystemExit):
        _parse("sla", "--archive", "a", "--input", "x", "--sla-p99-ms", "1",
               "--protocol", "grpc-v2")  # fmt: skip


def test_the_cli_runs_http_v2_binary_then_model_infer_on_one_server(
    tiny: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    archive, body = tiny
    args = _parse("run", "--archive", str(archive), "--input", str(body), "-c", "2",
                  "--duration", "0.5", "--warmup", "0", "--protocol", "grpc-v2",
                  "--json")  # fmt: skip
    assert args.func(args) == 0
    http, grpc_ = json.loads(capsys.readouterr().out)
    assert http["url"].endswith("/v2/models/tiny/infer")
    assert grpc_["url"].endswith("/inference.GRPCInferenceService/ModelInfer")
    for report in (http, grpc_):
        client = report["client"]
        assert client["sent"] > 0 and client["ok"] == client["sent"] == client["completed"]
        assert client["statuses"] == {"200": client["ok"]}


def test_both_routes_answer_binary_outputs_and_url_mode_loads_grpc_only(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    archive, body_file = tiny
    options = RunOptions(archive=archive, inputs=(body_file,), concurrency=2, duration_s=0.3,
                         warmup_s=0.0, run_dir=tmp_path)  # fmt: skip
    tensor = grpc_pair.load_tensor(body_file)
    with open_server(options) as (endpoints, model, _version):
        grpc_port = endpoints.grpc_port
        key = endpoints.inference_key
        body, head_len = tensor.http_body()
        answer = httpx.post(
            f"http://{endpoints.host}:{endpoints.inference_port}/v2/models/{model}/infer",
            content=body, timeout=60,
            headers={grpc_pair.HEADER_LENGTH: str(head_len), "Authorization": f"Bearer {key}"},
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        n = int(answer.headers[grpc_pair.HEADER_LENGTH])
        outputs = json.loads(answer.content[:n])["outputs"]
        sizes = [o["parameters"]["binary_data_size"] for o in outputs]
        assert sizes and sum(sizes) == len(answer.content) - n and "data" not in outputs[0]
        request_type, response_type, *_ = messages.method_types(grpc_pair.OIP_SERVICE, "ModelInfer")
        with grpc.insecure_channel(f"{endpoints.host}:{grpc_port}") as channel:
            infer = channel.unary_unary(f"/{grpc_pair.OIP_SERVICE}/ModelInfer",
                                        request_serializer=request_type.SerializeToString,
                                        response_deserializer=response_type.FromString)  # fmt: skip
            reply = infer(tensor.grpc_request(model, None), timeout=60,
                          metadata=[("authorization", f"Bearer {key}")])  # fmt: skip
        assert [len(r) for r in reply.raw_output_contents] == sizes
        (only,) = grpc_pair.run_grpc_bench(options.model_copy(update={
            "archive": None, "url": f"http://{endpoints.host}:{grpc_port}", "model": model,
            "token": key, "run_dir": None,
        }), oip=True)  # fmt: skip
    assert only.url.endswith("/ModelInfer") and only.result.sent > 0
    assert only.result.statuses == {"200": only.result.ok} and only.result.ok == only.result.sent
