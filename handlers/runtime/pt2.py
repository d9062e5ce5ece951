"""model-config.yaml's ``pt2`` section, applied as TorchServe 0.12's BaseHandler applies it.

* ``pt2: {compile: {enable: true, backend: inductor, mode: reduce-overhead, ...}}``: the model
  becomes ``torch.compile(model, **options)`` (every key but ``enable`` is passed on);
  ``enable: false`` compiles nothing.
* ``pt2: {export: {...}}``: nothing to compile here (TorchServe loads an AOT-compiled ``.so``
  instead; torchbay's AOTInductor packages are ``torchbay archive --convert aoti``).
* The older forms TorchServe still reads, with its deprecation warning: ``pt2: inductor`` (the
  backend) and ``pt2: {backend: ..., mode: ...}`` (the options).

A backend torch does not list is not compiled (a warning says so), and a compile that fails
leaves the model as it was, as TorchServe proceeds without compilation. ``torch.compile`` is lazy:
the first batch of each new shape pays for the compilation, which TorchServe users warm up for.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..errors import HandlerLoadError

log = logging.getLogger("torchbay.handler")


def compile_options(yaml_config: Any) -> dict[str, Any] | None:
    """``torch.compile``'s keyword arguments from model-config.yaml, or None: do not compile.
    Raises HandlerLoadError for a ``pt2`` that is neither a string nor a mapping (TorchServe's
    ValueError)."""
    if not isinstance(yaml_config, dict) or "pt2" not in yaml_config:
        return None
    value = yaml_config["pt2"]
    if isinstance(value, dict) and "compile" in value:
        options = value["compile"]
        if not isinstance(options, dict) or not options.get("enable"):
            return None
        return {k: v for k, v in options.items() if k != "enable"}
    if isinstance(value, dict) and "export" in value:
        return None
    if isinstance(value, str):
        options = {"backend": value}
    elif isinstance(value, dict):
        options = dict(value)
    else:
        raise HandlerLoadError("model-config pt2 should be a string or a mapping")
    log.warning(
        "pt2: %r: this way of giving torch.compile options is deprecated; use "
        "pt2: {compile: {enable: true, ...}} (https://github.com/pytorch/serve/issues/3164)",
        value,
    )
    return options


def apply(model: Any, yaml_config: Any) -> Any:
    """``model`` compiled as ``pt2`` asks, or ``model`` itself."""
    options = compile_options(yaml_config)
    if options is None or model is None:
        return model
    backend = options.get("backend")
    if backend is not None and backend not in torch._dynamo.list_backends(exclude_tags=()):
        log.warning("pt2: backend %r is not one torch.compile knows; not compiled", backend)
        return model
    described = ", ".join(f"{k} {v}" for k, v in options.items())
    try:
        compiled = torch.compile(model, **options)
    except Exception:  # TorchServe: "Proceeding without compilation"
        log.warning("compiling with %s failed; proceeding without", described, exc_info=True)
        return model
    log.info("Compiled model with %s", described)
    return compiled
