"""``torchbay verify ARCHIVE``: unpack safely, load the handler as a worker does, run one input.

The input is ``--input FILE`` or the example stored in the archive (for the ``tensor`` handler:
one sample, as raw little-endian float32, or ``.npy`` for integer inputs). Any failure (unsafe
archive, handler load error, non-2xx response) raises ArchiveError.
"""

from __future__ import annotations

import io
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchbay import __version__
from torchbay.archiver.errors import ArchiveArgumentError, ArchiveError
from torchbay.archiver.extract import extract_archive
from torchbay.archiver.manifest import Manifest

_CONTENT_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".json": "application/json",
    ".npy": "application/x-npy",
    ".txt": "text/plain",
}
_TENSOR_HANDLERS = {"tensor", "base", "torchbay.handlers.tensor"}


@dataclass(frozen=True)
class VerifyResult:
    """What one verification run produced."""

    manifest: Manifest
    status: int
    content_type: str
    body: bytes
    timings: dict[str, float]
    input_description: str

    @property
    def output(self) -> Any:
        """The response body parsed as JSON, or the raw text when it is not JSON."""
        try:
            return json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return self.body.decode("utf-8", "replace")


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


def _request_body(
    model_dir: Path,
    manifest: Manifest,
    handler: str,
    input_file: Path | None,
    content_type: str | None,
) -> tuple[bytes, str, str]:
    if input_file is not None:
        if not input_file.is_file():
            raise ArchiveArgumentError(f"--input {str(input_file)!r} does not exist")
        ctype = content_type or _CONTENT_TYPES.get(
            input_file.suffix.lower(), "application/octet-stream"
        )
        return input_file.read_bytes(), ctype, f"{input_file} ({ctype})"
    tb = manifest.torchbay
    if tb is None or tb.example_input is None:
        raise ArchiveArgumentError(
            "the archive stores no example input: pass --input FILE (e.g. an image)"
        )
    if tb.example_input.endswith(".npz"):
        raise ArchiveArgumentError(
            "the stored example has several inputs: pass --input FILE (e.g. an OIP v2 JSON "
            "request with --content-type application/json)"
        )
    if handler not in _TENSOR_HANDLERS:
        raise ArchiveArgumentError(
            f"handler {handler!r} takes its own input format: pass --input FILE "
            "(the stored example is a preprocessed tensor)"
        )
    body, ctype, what = _example_body(model_dir, manifest)
    return body, content_type or ctype, what


def verify_archive(
    path: str | Path,
    *,
    input_file: str | Path | None = None,
    content_type: str | None = None,
    handler: str | None = None,
) -> VerifyResult:
    """Extract ``path`` with the hash checks, load its service, predict one request."""
    if not Path(path).exists():
        raise ArchiveArgumentError(f"{path}: no such archive")
    with tempfile.TemporaryDirectory(prefix="torchbay-verify-") as tmp:
        model_dir = Path(tmp) / "model"
        manifest = extract_archive(path, model_dir)
        # Imported after the safety checks: an unsafe archive fails fast, without torch.
        from torchbay.handlers.errors import HandlerError
        from torchbay.handlers.service import Request, load_service

        spec = handler or manifest.model.handler
        body, ctype, what = _request_body(
            model_dir, manifest, spec, Path(input_file) if input_file else None, content_type
        )
        try:
            service = load_service(
                model_dir, handler=handler, batch_size=1, gpu_id=None, server_version=__version__
            )
            outcome = service.predict(
                [
                    Request(
                        request_id="0",
                        body=body,
                        content_type=ctype,
                        headers={"content-type": ctype},
                        query="",
                        protocol="predict",
                    )
                ]
            )
        except HandlerError as exc:
            raise ArchiveError(f"handler {spec!r}: {exc}") from None
    response = outcome.responses[0]
    result = VerifyResult(
        manifest=manifest,
        status=response.status,
        content_type=response.content_type,
        body=bytes(response.body),
        timings=dict(outcome.timings),
        input_description=what,
    )
    if not 200 <= response.status < 300:
        text = result.body.decode("utf-8", "replace").strip()
        raise ArchiveError(f"verify failed: the handler answered {response.status}: {text}")
    return result


def render(result: VerifyResult) -> str:
    m = result.manifest
    tb = m.torchbay
    kind = f"{tb.format}/{tb.precision}" if tb else "TorchServe archive"
    output = result.output
    shown = json.dumps(output) if not isinstance(output, str) else output
    timings = "  ".join(f"{k} {v:.2f} ms" for k, v in result.timings.items())
    return "\n".join(
        [
            f"model:   {m.model.model_name} {m.model.model_version} ({kind}, handler "
            f"{m.model.handler})",
            f"input:   {result.input_description}",
            f"status:  {result.status} {result.content_type}",
            f"output:  {shown}",
            f"timings: {timings}",
            "verify: OK",
        ]
    )
