"""``torchbay bench run --protocol grpc-v2``: the Open Inference Protocol over gRPC, beside HTTP.

The same closed loop as ``--protocol grpc`` (``grpc_load.py``), for the KServe v2 pair: HTTP
``/v2/models/{m}/infer`` with the binary tensor data extension (a JSON inference header, then the
raw tensor bytes; ``Inference-Header-Content-Length`` says where the JSON ends) through the
regular load generator, then gRPC ``inference.GRPCInferenceService/ModelInfer`` with the same
bytes in ``raw_input_contents``. Both ask for binary outputs (``binary_data_output``; ModelInfer
always answers in ``raw_output_contents``). With ``--archive`` one server runs both, two reports
side by side; with ``--url`` (the gRPC address) only gRPC runs. Torch-free.

The input tensor, from the one ``--input``:

- a ``.mar`` archive (the ``--archive`` itself, say): the example input it records
  (``torchbay archive --example-input x.npy``), named as its signature names its one input;
- a ``.npy`` file: that array, its datatype from its dtype, named as the archive's recorded
  signature names its one input (``input0`` otherwise);
- any other file: one ``BYTES`` element holding the file, named ``data``. The tiny and cnn
  benchmark archives take this: their handler (``handler_raw.py``) does not speak v2, and the
  worker hands such a handler a one-element BYTES input as the raw bytes, the float32 sample.
"""

from __future__ import annotations

import io
import json
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchbay.benchmarks.bench import BenchReport, RunOptions
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.grpc_load import GrpcTarget, closed_loop_only, run_pair
from torchbay.benchmarks.managed import Endpoints

OIP_SERVICE = "inference.GRPCInferenceService"
HEADER_LENGTH = "Inference-Header-Content-Length"
BODY_FILE = "oip-binary-body.bin"
# numpy dtype (little-endian) -> OIP datatype
_DATATYPES = {
    "|b1": "BOOL",
    "|u1": "UINT8",
    "<u2": "UINT16",
    "<u4": "UINT32",
    "<u8": "UINT64",
    "|i1": "INT8",
    "<i2": "INT16",
    "<i4": "INT32",
    "<i8": "INT64",
    "<f2": "FP16",
    "<f4": "FP32",
    "<f8": "FP64",
}


@dataclass(frozen=True)
class OipTensor:
    """One input tensor as both routes carry it: its header fields and its raw bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes

    def http_body(self) -> tuple[bytes, int]:
        """The binary-extension body (JSON header + raw bytes), and the header's length."""
        header = {
            "inputs": [
                {
                    "name": self.name,
                    "datatype": self.datatype,
                    "shape": list(self.shape),
                    "parameters": {"binary_data_size": len(self.raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        return head + self.raw, len(head)

    def grpc_request(self, model: str, version: str | None) -> Any:
        """The ``ModelInferRequest``, built with the server's own message classes."""
        from torchbay.server.grpc.messages import message

        request = message("inference.ModelInferRequest")(
            model_name=model, model_version=version or ""
        )
        request.inputs.add(name=self.name, datatype=self.datatype, shape=list(self.shape))
        request.raw_input_contents.append(self.raw)
        return request


def load_tensor(path: Path, archive: Path | None = None) -> OipTensor:
    """The input tensor from ``path`` (see the module's docstring); BenchError when unreadable."""
    if Path(path).suffix.lower() == ".mar":
        return archive_example(Path(path))
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise BenchError(f"cannot read input {path}: {exc}") from None
    if Path(path).suffix.lower() != ".npy":
        return OipTensor("data", "BYTES", (1,), struct.pack("<I", len(raw)) + raw)
    return _from_npy(raw, Path(path).name, _input_name(archive))


def archive_example(archive: Path) -> OipTensor:
    """The example input ``archive`` records (``torchbay archive --example-input x.npy``), named
    as its signature names its one input."""
    import zipfile

    from torchbay.archiver.errors import ArchiveError
    from torchbay.archiver.manifest import read_manifest

    try:
        info = read_manifest(archive).torchbay
        example = info.example_input if info is not None else None
        if not example or not example.endswith(".npy"):
            raise BenchError(f"{archive.name} records no one-tensor example input (.npy)")
        with zipfile.ZipFile(archive) as zf:
            raw = zf.read(example)
    except (ArchiveError, OSError, KeyError, zipfile.BadZipFile) as exc:
        raise BenchError(f"cannot read the example input of {archive.name}: {exc}") from None
    return _from_npy(raw, f"{archive.name}:{example}", _input_name(archive))


def _from_npy(raw: bytes, label: str, name: str) -> OipTensor:
    import numpy as np

    try:
        array = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BenchError(f"{label}: not a numeric .npy array: {exc}") from None
    datatype = _DATATYPES.get(array.dtype.newbyteorder("<").str)
    if datatype is None:
        raise BenchError(f"{label}: numpy dtype {array.dtype} has no OIP datatype")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return OipTensor(name, datatype, tuple(array.shape), data)


def _input_name(archive: Path | None) -> str:
    """The archive's recorded single input's name, else ``input0``."""
    if archive is None:
        return "input0"
    from torchbay.archiver.errors import ArchiveError
    from torchbay.archiver.manifest import read_manifest

    try:
        info = read_manifest(archive).torchbay
    except (ArchiveError, OSError):
        return "input0"  # starting the server says what is wrong with it
    inputs = info.inputs if info is not None else None
    return inputs[0].name if inputs and len(inputs) == 1 else "input0"


def run_oip_bench(
    options: RunOptions, on_progress: Callable[[Any], None] | None = None
) -> list[BenchReport]:
    """The HTTP v2 binary report then the ModelInfer one (``--archive``), or ModelInfer alone
    (``--url``: the server's gRPC address)."""
    closed_loop_only(options, "grpc-v2")
    if len(options.inputs) != 1:
        raise BenchError("--protocol grpc-v2 sends one input tensor: give one --input")
    tensor = load_tensor(options.inputs[0], options.archive)

    def target(endpoints: Endpoints, port: int, model: str) -> GrpcTarget:
        key, metrics = endpoints.inference_key, endpoints.metrics_port
        where = (endpoints.host, port, model, options.version, key, (), metrics)
        grpc_ = GrpcTarget(*where, service=OIP_SERVICE, method="ModelInfer")
        grpc_.requests = (tensor.grpc_request(model, options.version),)  # sent over and over
        return grpc_

    body, head_len = tensor.http_body()
    with tempfile.TemporaryDirectory(prefix="tb-bench-oip-") as tmp:
        body_file = Path(tmp) / BODY_FILE
        body_file.write_bytes(body)
        http = {
            "protocol": "v2",
            "inputs": (body_file,),
            "content_type": "application/octet-stream",
            "headers": ((HEADER_LENGTH, str(head_len)),),
        }
        return run_pair(options, target, http, on_progress)
