"""The model's OIP tensor signature, read once when the worker loads the model.

Torch-free. ``archiver.signature.model_signature`` is the contract: model-config.yaml's
``inputs``/``outputs`` over the manifest's recorded ``torchbay.inputs``/``outputs``. A signature
that is not valid fails the load (``HandlerLoadError``), as any broken archive does.

``archiver.signature`` (pydantic: about 0.1 s of a worker's start) is imported only when something
describes the tensors; a TorchServe ``.mar`` has no signature and never pays for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchbay.archiver.signature_sources import describes_tensors

from .errors import HandlerLoadError

if TYPE_CHECKING:
    from torchbay.archiver.signature import Signature


def load(manifest: dict[str, Any], yaml_config: dict[str, Any] | None) -> Signature | None:
    """The model's signature, or None when nothing describes its tensors."""
    info = manifest.get("torchbay")
    info = info if isinstance(info, dict) else None
    if not describes_tensors(info or {}, yaml_config or {}):
        return None  # model_signature's answer too, without importing it
    from torchbay.archiver.signature import SignatureError, model_signature

    try:
        return model_signature(info, yaml_config)
    except SignatureError as exc:
        raise HandlerLoadError(f"invalid tensor signature: {exc}") from exc


def for_requests(
    manifest: dict[str, Any], yaml_config: dict[str, Any] | None, handler: Any
) -> Signature | None:
    """The signature OIP requests are checked against: the model's when the handler speaks v2
    natively (it hands the request's tensors to the model), else only one model-config.yaml
    declares: a handler that preprocesses (an image classifier taking BYTES) takes requests
    that look nothing like its model's recorded tensors."""
    signature = load(manifest, yaml_config)
    native = bool(getattr(handler, "supports_v2", False))
    declared = bool(yaml_config) and ("inputs" in yaml_config or "outputs" in yaml_config)
    return signature if native or declared else None


def output_names(signature: Signature | None, count: int) -> list[str]:
    """Names for a model's ``count`` positional outputs: the signature's, else output0, ..."""
    names = [s.name for s in signature.outputs] if signature is not None else []
    return [names[k] if k < len(names) else f"output{k}" for k in range(count)]
