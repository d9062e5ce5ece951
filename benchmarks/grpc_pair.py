"""``torchbay bench run --protocol grpc`` (TorchServe's ``Predictions`` beside ``/predictions``)
and ``grpc-v2`` (``ModelInfer`` beside ``/v2/models/{m}/infer``, binary extension): one closed
loop per side on one server; with ``--url`` (the gRPC address), gRPC alone. A gRPC target is a
``loadplan.Target`` of serialized messages, so both sides are one ``bench.measure``.
"""

from __future__ import annotations

import io
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchbay.archiver.errors import ArchiveError
from torchbay.archiver.manifest import read_manifest
from torchbay.benchmarks import bench
from torchbay.benchmarks.bench import BenchReport, RunOptions
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadplan import Target
from torchbay.benchmarks.managed import Endpoints, bearer

SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
OIP_SERVICE = "inference.GRPCInferenceService"
HEADER_LENGTH = "Inference-Header-Content-Length"
BODY_FILE = "oip-binary-body.bin"


@dataclass(frozen=True)
class OipTensor:
    """One input tensor as both routes carry it: its header fields and its raw bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes

    def http_body(self) -> tuple[bytes, int]:
        """The binary-extension body (JSON header + raw bytes) and the header's length: the
        server's own conversion of :meth:`grpc_request`, so both routes carry the same input."""
        from torchbay.server.grpc.tensors import request_body

        return request_body(self.grpc_request("", None))

    def grpc_request(self, model: str, version: str | None) -> Any:
        """The ``ModelInferRequest``, built with the server's own message classes."""
        from torchbay.server.grpc.messages import message

        new_request = message("inference.ModelInferRequest")
        request = new_request(model_name=model, model_version=version or "")
        request.inputs.add(name=self.name, datatype=self.datatype, shape=list(self.shape))
        request.raw_input_contents.append(self.raw)
        return request


def load_tensor(path: Path, archive: Path | None = None) -> OipTensor:
    """The tensor of ``path``: a ``.mar``'s recorded example input (``torchbay archive
    --example-input x.npy``), a ``.npy`` array (named as the archive's signature names its one
    input, else ``input0``), or any other file as one ``BYTES`` element named ``data`` (the tiny
    and cnn raw handlers read it back as the body)."""
    import numpy as np

    from torchbay.handlers.runtime.oip_binary import datatype_of

    path = Path(path)
    if path.suffix.lower() == ".mar":
        archive, (raw, label) = path, _archive_example(path)
    else:
        try:
            raw, label = path.read_bytes(), path.name
        except OSError as exc:
            raise BenchError(f"cannot read input {path}: {exc}") from None
        if path.suffix.lower() != ".npy":
            return OipTensor("data", "BYTES", (1,), struct.pack("<I", len(raw)) + raw)
    try:
        info = None if archive is None else read_manifest(archive).torchbay
    except (ArchiveError, OSError):
        info = None  # starting the server says what is wrong with the archive
    inputs = info.inputs if info is not None else None
    try:
        array = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BenchError(f"{label}: not a numeric .npy array: {exc}") from None
    try:
        datatype = datatype_of(array)
    except ValueError:
        datatype = "BYTES"
    if datatype == "BYTES":  # a string array: not a tensor to send as raw bytes
        raise BenchError(f"{label}: numpy dtype {array.dtype} has no OIP datatype")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    name = inputs[0].name if inputs and len(inputs) == 1 else "input0"
    return OipTensor(name, datatype, tuple(array.shape), data)


def _archive_example(archive: Path) -> tuple[bytes, str]:
    """The .npy bytes of the example input ``archive`` records, and a label for errors."""
    import zipfile

    try:
        info = read_manifest(archive).torchbay
        example = info.example_input if info is not None else None
        if not example or not example.endswith(".npy"):
            raise BenchError(f"{archive.name} records no one-tensor example input (.npy)")
        with zipfile.ZipFile(archive) as zf:
            return zf.read(example), f"{archive.name}:{example}"
    except (ArchiveError, OSError, KeyError, zipfile.BadZipFile) as exc:
        raise BenchError(f"cannot read the example input of {archive.name}: {exc}") from None


def grpc_target(endpoints: Endpoints, port: int, method: str, messages: list[Any]) -> Target:
    """The load generator's gRPC target: ``messages`` serialized, sent in turn to ``method``
    (``/package.Service/Method``), the inference key as ``authorization`` metadata."""
    auth = tuple(bearer(endpoints.inference_key).items())  # metadata keys go lower-case
    payloads = tuple(m.SerializeToString() for m in messages)
    return Target(endpoints.host, port, "", payloads, auth, grpc=method)


def predictions(model: str, version: str | None, payloads: tuple[bytes, ...]) -> list[Any]:
    """One TorchServe ``PredictionsRequest`` per payload (the ``data`` entry)."""
    from torchbay.server.grpc.messages import method_types

    request_type = method_types(SERVICE, "Predictions")[0]
    fields = {"model_name": model, "model_version": version or ""}
    return [request_type(**fields, input={"data": body}) for body in payloads]


def run_grpc_bench(
    options: RunOptions, oip: bool = False, on_progress: Callable[[Any], None] | None = None
) -> list[BenchReport]:
    """The HTTP report then the gRPC one on one server (``--archive``), or the gRPC one alone
    (``--url``: the server's gRPC address). ``oip``: the v2 pair (``grpc-v2``), else
    TorchServe's (``grpc``)."""
    name = "grpc-v2" if oip else "grpc"
    if options.concurrency is None or options.requests is not None:
        raise BenchError(f"--protocol {name} runs a closed loop: give --concurrency and --duration")
    if oip and len(options.inputs) != 1:
        raise BenchError("--protocol grpc-v2 sends one input tensor: give one --input")
    tensor = load_tensor(options.inputs[0], options.archive) if oip else None
    with (
        bench.open_server(options) as (endpoints, model, version),
        tempfile.TemporaryDirectory() as tmp,
    ):
        if tensor is None:
            http = options
            method = f"/{SERVICE}/Predictions"
            messages = predictions(model, version, bench.load_payloads(options.inputs, "predict"))
        else:
            http = _v2_binary(options, tensor, Path(tmp) / BODY_FILE)
            method = f"/{OIP_SERVICE}/ModelInfer"
            messages = [tensor.grpc_request(model, version)]  # sent over and over
        reports = []
        if options.url is None:
            assert endpoints.grpc_port is not None
            bench.configure(options, endpoints, model, version)
            target = bench.make_target(endpoints, http, model, version)
            reports.append(bench.measure(http, endpoints, model, version, target, on_progress))
        port = endpoints.inference_port if options.url else endpoints.grpc_port
        target = grpc_target(endpoints, port or 0, method, messages)
        reports.append(bench.measure(options, endpoints, model, version, target))
    return reports


def _v2_binary(options: RunOptions, tensor: OipTensor, body_file: Path) -> RunOptions:
    """``options`` for the HTTP side of the v2 pair: the binary-extension body of ``tensor``."""
    body, head_len = tensor.http_body()
    body_file.write_bytes(body)
    octets, headers = "application/octet-stream", ((HEADER_LENGTH, str(head_len)),)
    update = {"protocol": "v2", "inputs": (body_file,), "content_type": octets, "headers": headers}
    return options.model_copy(update=update)


def format_side_by_side(reports: list[BenchReport]) -> str:
    """Each report's table, then one line comparing gRPC with HTTP."""
    text = "\n\n".join(bench.format_report(r) for r in reports)
    if len(reports) == 2:
        http, grpc_ = (r.result for r in reports)
        text += (
            f"\n\ngRPC vs HTTP: {grpc_.ok_per_s:,.1f} vs {http.ok_per_s:,.1f} ok/s, "
            f"p50 {grpc_.latency.p50_ms:.2f} vs {http.latency.p50_ms:.2f} ms, "
            f"p99 {grpc_.latency.p99_ms:.2f} vs {http.latency.p99_ms:.2f} ms"
        )
    return text
