"""A malformed value in config.properties warns and keeps the default, as TorchServe starts on
the files real deployments write (SageMaker's toolkit appends its keys to a file that lacks a
final newline, so ``enable_model_api=truedefault_response_timeout=60`` is one line).

Only values read from the file are forgiven: a flag or an environment variable was typed for this
run, and stays an error. Nor are the keys whose default would not be the safe reading of a
broken value: where the server listens (``UNSAFE`` below: its addresses), what it trusts (TLS
key and certificate, the API key files, ``allowed_urls``) and where it reads models from
(``model_store``, ``load_models``, ``models``), and which variables a handler must not see
(``blacklist_env_vars``). A typo there refuses the whole configuration, as
before. Every other key has a default that is the cautious one (authorization on, the model API
off, TorchServe's limits and timeouts). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from pydantic import ValidationError

from torchbay.server.config.settings import ServerConfig

UNSAFE = frozenset(
    {
        "inference_address",
        "management_address",
        "metrics_address",
        "grpc_inference_address",
        "grpc_management_address",
        "grpc_inference_port",
        "grpc_management_port",
        "enable_grpc_ssl",
        "private_key_file",
        "certificate_file",
        "key_file",
        "token_keys_file",
        "allowed_urls",
        "blacklist_env_vars",
        "model_store",
        "load_models",
        "models",
    }
)


def validate(
    merged: MutableMapping[str, Any], from_file: Mapping[str, Any], where: str, notes: list[str]
) -> ServerConfig:
    """``ServerConfig`` from ``merged``, dropping (and noting) each bad value that came from the
    file (``from_file``: the file's fields) and is not in ``UNSAFE``, so its default applies.
    Raises the ValidationError of what is left when a bad value may not be dropped."""
    forgivable = {k for k, v in from_file.items() if k not in UNSAFE and merged.get(k) is v}
    while True:
        try:
            return ServerConfig.model_validate(merged)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]} & forgivable
            if not bad:
                raise
            for key in sorted(bad):
                default = ServerConfig.model_fields[key].get_default(call_default_factory=True)
                notes.append(
                    f"WARNING {where}: malformed value {_shown(merged.pop(key))} for {key}: "
                    f"kept the default {_shown(default)}"
                )
                forgivable.discard(key)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
