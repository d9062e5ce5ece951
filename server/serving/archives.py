"""The one seam through which the server uses the archiver (``torchbay.archiver``).

The registry reads an archive's manifest, extracts it under the server's limits (expanded size,
compression ratio) and checks names with what is re-exported here, and nothing else of the
archiver; workflows (``server/workflows``) unpack their ``.war`` with ``extract_war``.
``ArchiveError`` is what every one of them raises on a bad archive (the registry answers it
400). ``signature_of`` gives a model's tensor signature (the manifest's recorded
one, overridden by model-config.yaml's ``inputs``/``outputs``). Torch-free: the archiver's
reading side does not import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchbay.archiver.errors import ArchiveError
from torchbay.archiver.extract import extract_archive
from torchbay.archiver.manifest import (
    MANIFEST_PATH,
    Manifest,
    ModelInfo,
    handler_spec_problem,
    is_valid_model_name,
    is_valid_model_version,
    read_manifest,
    safe_relpath,
)
from torchbay.archiver.signature import Signature, SignatureError, TensorSpec, model_signature
from torchbay.archiver.war import WAR_MANIFEST, extract_war


def signature_of(manifest: Manifest, yaml_config: Mapping[str, Any] | None) -> Signature | None:
    """The signature a model serves, or None when nothing describes it. ``yaml_config`` is the
    archive's model-config.yaml (its ``inputs``/``outputs`` replace the recorded lists).
    Raises ArchiveError naming the file and the field of an invalid signature."""
    info = manifest.torchbay.model_dump() if manifest.torchbay is not None else None
    try:
        return model_signature(info, yaml_config)
    except SignatureError as exc:
        text, config_file = str(exc), manifest.model.config_file
        if config_file and text.startswith("model-config.yaml"):  # the archive's own file name
            text = config_file + text.removeprefix("model-config.yaml")
        raise ArchiveError(f"Invalid model signature: {text}") from None


__all__ = [
    "MANIFEST_PATH",
    "WAR_MANIFEST",
    "ArchiveError",
    "Manifest",
    "ModelInfo",
    "Signature",
    "TensorSpec",
    "extract_archive",
    "extract_war",
    "handler_spec_problem",
    "is_valid_model_name",
    "is_valid_model_version",
    "read_manifest",
    "safe_relpath",
    "signature_of",
]
