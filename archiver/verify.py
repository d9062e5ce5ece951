"""``torchbay verify ARCHIVE``: unpack safely, load the handler as a worker does, run inputs.

The inputs are ``--input FILE`` (repeatable: one request each, in batches of ``--batch-size``) or
the example stored in the archive (for the ``tensor`` handler: one sample, as raw little-endian
float32, or ``.npy`` for integer inputs; for a model of several inputs, their first rows as an
Open Inference Protocol request). An OIP request given as ``--input`` takes the ``/v2`` path too.
The requests go through ``handlers.testing``'s Runner, i.e. ``load_service`` and
``Service.predict``, the worker's own code. An unsafe archive or a
handler that fails to load raises ArchiveError; the report says which responses failed: any 5xx
(a bug of the handler), or a non-2xx answer to the stored example (a model must take its own).
A 4xx to a given input is the handler refusing that input, shown but not a failure.
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchbay import __version__
from torchbay.archiver.errors import ArchiveArgumentError, ArchiveError
from torchbay.archiver.extract import extract_archive
from torchbay.archiver.manifest import Manifest

_TENSOR_HANDLERS = {"tensor", "base", "torchbay.handlers.tensor"}


@dataclass(frozen=True)
class VerifyResult:
    """What one request of a verification run produced."""

    manifest: Manifest
    status: int
    content_type: str
    body: bytes
    timings: dict[str, float]
    input_description: str
    stored_example: bool = False
    parts: tuple[bytes, ...] = ()  # what a streaming handler sent before ``body``

    @property
    def output(self) -> Any:
        """The response body parsed as JSON, or the raw text when it is not JSON."""
        try:
            return json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return self.body.decode("utf-8", "replace")

    @property
    def failed(self) -> bool:
        """A 5xx, or any non-2xx answer to the archive's own stored example."""
        return self.status >= 500 or (self.stored_example and not 200 <= self.status < 300)


@dataclass(frozen=True)
class VerifyReport:
    """Every request of one ``torchbay verify`` run, in input order."""

    manifest: Manifest
    results: list[VerifyResult]
    timings: dict[str, float]

    @property
    def failures(self) -> list[VerifyResult]:
        return [r for r in self.results if r.failed]


def _example_body(model_dir: Path, manifest: Manifest) -> tuple[bytes, str, str]:
    import numpy as np

    tb = manifest.torchbay
    assert tb is not None and tb.example_input is not None
    array = np.load(model_dir / tb.example_input, allow_pickle=False)
    sample = np.ascontiguousarray(array[0])
    what = f"stored example {tb.example_input}[0] shape {list(sample.shape)}"
    if np.issubdtype(sample.dtype, np.floating):
        return sample.astype("<f4").tobytes(), "application/octet-stream", what
    buf = io.BytesIO()
    np.save(buf, sample, allow_pickle=False)
    return buf.getvalue(), "application/x-npy", what


def _input_request(input_file: Path, content_type: str | None, index: int) -> Any:
    """One request of a --input file; an Open Inference Protocol request (a JSON object whose
    ``inputs`` are named tensors) goes the way ``/v2/models/{name}/infer`` takes it."""
    from torchbay.handlers.testing import make_request

    if not input_file.is_file():
        raise ArchiveArgumentError(f"--input {str(input_file)!r} does not exist")
    request = make_request(input_file, content_type=content_type, request_id=str(index))
    if _is_oip_request(request.body, request.content_type):
        request = make_request(
            input_file, content_type=content_type, request_id=str(index), protocol="v2"
        )
        return request, f"{input_file} (Open Inference Protocol request)"
    return request, f"{input_file} ({request.content_type})"


def _is_oip_request(body: bytes, content_type: str) -> bool:
    """A JSON ``{"inputs": [{"name", "shape", "datatype", ...}, ...]}`` (not TorchServe's
    ``{"inputs": "text"}`` of many handlers)."""
    if "json" not in content_type.lower():
        return False
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False
    inputs = data.get("inputs") if isinstance(data, dict) else None
    return (
        isinstance(inputs, list)
        and bool(inputs)
        and all(isinstance(t, dict) and {"name", "shape", "datatype"} <= t.keys() for t in inputs)
    )


def _oip_example(model_dir: Path, name: str) -> Any:
    """The first row of every input of a multi-input example (``.npz``) as an OIP request."""
    import numpy as np

    from torchbay.archiver.signature import TORCH_TO_OIP
    from torchbay.handlers.testing import make_request

    with np.load(model_dir / name, allow_pickle=False) as npz:
        rows = {key: npz[key][:1] for key in npz.files}
    inputs = [
        {
            "name": key,
            "shape": list(row.shape),
            "datatype": TORCH_TO_OIP[str(row.dtype)],
            "data": row.reshape(-1).tolist(),
        }
        for key, row in rows.items()
    ]
    request = make_request({"inputs": inputs}, protocol="v2")
    return request, f"stored example {name}[0] ({', '.join(rows)}) as an OIP request"


def _example_request(model_dir: Path, manifest: Manifest, handler: str, ctype: str | None) -> Any:
    from torchbay.handlers.testing import make_request

    tb = manifest.torchbay
    if tb is None or tb.example_input is None:
        raise ArchiveArgumentError(
            "the archive stores no example input: pass --input FILE (e.g. an image)"
        )
    if handler not in _TENSOR_HANDLERS:
        raise ArchiveArgumentError(
            f"handler {handler!r} takes its own input format: pass --input FILE "
            "(the stored example is a preprocessed tensor)"
        )
    if tb.example_input.endswith(".npz"):  # several inputs: by name, as OIP clients send them
        return _oip_example(model_dir, tb.example_input)
    body, example_type, what = _example_body(model_dir, manifest)
    return make_request(body, content_type=ctype or example_type), what


def verify_archive(
    path: str | Path,
    *,
    input_files: Sequence[str | Path] = (),
    content_type: str | None = None,
    handler: str | None = None,
    batch_size: int = 1,
) -> VerifyReport:
    """Extract ``path`` with the hash checks, load its service, answer each input (or the
    stored example) in batches of ``batch_size``, as a worker with that batch size would."""
    if not Path(path).exists():
        raise ArchiveArgumentError(f"{path}: no such archive")
    if batch_size < 1:
        raise ArchiveArgumentError(f"--batch-size must be at least 1, got {batch_size}")
    with tempfile.TemporaryDirectory(prefix="torchbay-verify-") as tmp:
        model_dir = Path(tmp) / "model"
        manifest = extract_archive(path, model_dir)
        # Imported after the safety checks: an unsafe archive fails fast, without torch.
        from torchbay.handlers.errors import HandlerError
        from torchbay.handlers.runtime.service import load_service
        from torchbay.handlers.testing import Runner

        spec = handler or manifest.model.handler
        if input_files:
            pairs = [_input_request(Path(f), content_type, i) for i, f in enumerate(input_files)]
        else:
            pairs = [_example_request(model_dir, manifest, spec, content_type)]
        try:
            service = load_service(
                model_dir,
                handler=handler,
                batch_size=batch_size,
                gpu_id=None,
                server_version=__version__,
            )
            runner = Runner(service, batch_size)
            replies = runner.run([request for request, _ in pairs])
        except HandlerError as exc:
            said = str(exc)  # the loader's own words may name the handler already
            named = said.startswith(f"handler {spec!r}")
            raise ArchiveError(said if named else f"handler {spec!r}: {said}") from None
    results = [
        VerifyResult(
            manifest=manifest,
            status=reply.status,
            content_type=reply.content_type,
            body=reply.body,
            timings=dict(runner.timings),
            input_description=what,
            stored_example=not input_files,
            parts=reply.parts,
        )
        for reply, (_, what) in zip(replies, pairs, strict=True)
    ]
    return VerifyReport(manifest, results, dict(runner.timings))


def render(report: VerifyReport) -> str:
    m = report.manifest
    tb = m.torchbay
    kind = f"{tb.format}/{tb.precision}" if tb else "TorchServe archive"
    lines = [
        f"model:   {m.model.model_name} {m.model.model_version} ({kind}, handler {m.model.handler})"
    ]
    for result in report.results:
        output = result.output
        shown = json.dumps(output) if not isinstance(output, str) else output
        lines += [
            f"input:   {result.input_description}",
            f"status:  {result.status} {result.content_type}",
            f"output:  {shown}",
        ]
        if result.parts:
            streamed = b"".join((*result.parts, result.body)).decode("utf-8", "replace")
            lines.append(f"stream:  {len(result.parts)} parts, then the output: {streamed}")
    lines.append("timings: " + "  ".join(f"{k} {v:.2f} ms" for k, v in report.timings.items()))
    failures = report.failures
    refused = sum(1 for r in report.results if 400 <= r.status < 500 and not r.failed)
    if failures:
        statuses = ", ".join(str(r.status) for r in failures)
        lines.append(f"verify: FAILED ({len(failures)} of {len(report.results)}: {statuses})")
    elif refused:
        lines.append(f"verify: OK ({refused} of {len(report.results)} refused with a 4xx)")
    else:
        lines.append("verify: OK")
    return "\n".join(lines)
