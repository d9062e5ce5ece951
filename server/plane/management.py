"""The management operations (list, describe, register, scale and tune, set the default version,
unregister) and the state they share, for every protocol.

Each operation takes parsed parameters (``plane.params``) and returns plain data: a dict or list,
or a ``Status`` where TorchServe answers ``{"status": ...}`` with its own code (202, 206). Errors
are raised from ``errors``' tree; the HTTP routes (``http.model_routes``) and the gRPC service
(``grpc.management``) map both to their protocol. Model settings are checked against
``ModelConfig``'s own bounds before anything changes; register and unregister raise
MethodNotAllowed unless ``enable_model_api``.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchbay.server.config.model_settings import check_model_settings
from torchbay.server.config.settings import ServerConfig
from torchbay.server.errors import (
    BadRequest,
    ConfigError,
    InsufficientStorage,
    MethodNotAllowed,
    ModelNotFound,
    ModelVersionNotFound,
    NotFound,
    ShuttingDown,
    TorchbayError,
)
from torchbay.server.plane.describe import customized as customized_metadata
from torchbay.server.plane.describe import describe as describe_version
from torchbay.server.plane.params import ScaleParams, register_overrides, scale_params
from torchbay.server.serving.admission import stopping_message
from torchbay.server.serving.handle import WorkerLoadError
from torchbay.server.serving.model import ModelStatus, ModelVersion
from torchbay.server.serving.registry import ModelRegistry

log = logging.getLogger("torchbay.management")

_background: set[asyncio.Task] = set()
_INT32_MAX = 2**31 - 1  # TorchServe's parameters are Java ints: a larger one is junk


@dataclass
class Management:
    """What the management operations work on: the registry, the server's settings, and one lock
    per model version so that scales and tunings of one version run one at a time (an
    unregister takes no turn: it stops a scale whose workers are still loading)."""

    registry: ModelRegistry
    config: ServerConfig
    # Called after every operation that changed what runs (TorchServe's config snapshot).
    changed: Callable[[], object] = lambda: None
    locks: weakref.WeakKeyDictionary[ModelVersion, asyncio.Lock] = field(
        default_factory=weakref.WeakKeyDictionary
    )

    def lock_for(self, mv: ModelVersion) -> asyncio.Lock:
        lock = self.locks.get(mv)
        if lock is None:
            lock = self.locks[mv] = asyncio.Lock()
        return lock


@dataclass(frozen=True)
class Status:
    """TorchServe's ``{"status": message}`` answer, with its code."""

    message: str
    code: int = 200

    @property
    def body(self) -> dict[str, str]:
        return {"status": self.message}


def require_model_api(state: Management) -> None:
    """Register and unregister need the model API (``enable_model_api``)."""
    if not state.config.enable_model_api:
        raise MethodNotAllowed(
            "Model API control is disabled: registering and unregistering models needs "
            "--enable-model-api (enable_model_api=true)"
        )


def present(state: Management, name: str, version: str | None = None) -> ModelVersion:
    """The registry's version (the default one when ``version`` is None), one being
    unregistered taken as gone (404): TorchServe takes a version out of its map before draining
    it, so a set-default, scale, describe or second unregister meanwhile finds no such version."""
    mv = state.registry.resolve(name, version)
    if mv.leaving:
        raise ModelVersionNotFound(
            f"Model version: {mv.version} does not exist for model: {name}",
            oip_message=ModelVersionNotFound.triton_text(name, mv.version),
        )
    return mv


# -- list, describe -----------------------------------------------------------------------------


def list_models(state: Management, limit: int | None, next_page_token: int | None) -> dict:
    """TorchServe's paging: a limit that is absent, negative or over 100 is 100; an absent or
    negative token is 0, and so is one past Java's int (TorchServe's junk); ``nextPageToken`` is
    there unless the page ran past the end."""
    size = 100 if limit is None or not 0 <= limit <= 100 else limit
    token = next_page_token if next_page_token is not None else 0
    token = token if 0 <= token <= _INT32_MAX else 0
    # A workflow's function nodes (no URL: server/workflows) are models TorchServe never lists.
    names = sorted(n for n in state.registry.models if state.registry.resolve(n).url)
    body: dict[str, Any] = {}
    if token + size <= len(names):
        body["nextPageToken"] = str(token + size)
    page = names[token : token + size]
    body["models"] = [{"modelName": n, "modelUrl": state.registry.resolve(n).url} for n in page]
    return body


async def describe(
    state: Management, name: str, version: str | None = None, customized: bool = False
) -> list[dict[str, Any]]:
    """The default version (``version`` None), one version, or every one (``"all"``);
    ``customized``: with the handler's own description (``customizedMetadata``), as TorchServe
    adds it to one version's, never to ``all``."""
    registry = state.registry
    if version == "all":
        registry.resolve(name)
        staying = [mv for mv in registry.models[name].values() if not mv.leaving]
        if not staying:
            raise ModelNotFound(f"Model not found: {name}")
        return [describe_version(registry, mv) for mv in staying]
    mv = present(state, name, version)
    described = describe_version(registry, mv)
    if customized:
        described["customizedMetadata"] = await customized_metadata(mv)
    return [described]


# -- register -----------------------------------------------------------------------------------


async def register(state: Management, params: Any) -> Status:
    """Register an archive (``params``: ``plane.params.RegisterParams``)."""
    check_model_settings(params.model_dump())
    config = state.config
    # TorchServe registers with default_workers_per_model only when the server sets it, else 0.
    set_default = "default_workers_per_model" in config.model_fields_set
    default_workers = config.default_workers_per_model if set_default else 0
    try:
        mv = await state.registry.register(
            params.url,
            name=params.model_name,
            overrides=register_overrides(params),
            initial_workers=params.initial_workers,
            synchronous=params.synchronous,
            default_workers=default_workers,
            startup=False,
        )
    except ConfigError as exc:  # a bad setting from the request, mapped at the boundary
        raise BadRequest(exc.message) from None
    except WorkerLoadError as exc:
        if not exc.out_of_memory:
            raise
        # SageMaker's multi-model contract: 507 asks its platform to unload models and retry.
        raise InsufficientStorage(
            f"Model {params.model_name or params.url!r} could not be loaded: its worker ran out "
            f"of memory ({exc.error_type})"
        ) from None
    mv.runtime = params.runtime  # describe shows it, as TorchServe's does
    state.changed()
    registered = f'Model "{mv.name}" Version: {mv.version} registered with'
    if mv.settings.min_workers == 0:
        return Status(
            f"{registered} 0 initial workers. Use scale workers API to add workers for the model."
        )
    if not params.synchronous:
        return Status("Processing worker updates...", 202)
    return Status(f"{registered} {mv.ready_workers} initial workers")


# -- scale and tune -----------------------------------------------------------------------------


async def _settle(mv: ModelVersion) -> None:
    """Wait (bounded by the start-up timeout) while workers of ``mv`` are still starting, e.g.
    those of an asynchronous registration: a scale counts them once they have loaded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + mv.settings.startup_timeout_s + 5
    while mv.status is ModelStatus.LOADING and loop.time() < deadline:
        await asyncio.sleep(0.05)


async def _scale(state: Management, mv: ModelVersion, params: ScaleParams) -> bool:
    """Whether it scaled down: that stops workers still loading at once, as TorchServe's."""
    async with state.lock_for(mv):
        live = sum(not slot.retiring for slot in mv.slots)
        shrink = params.min_worker is not None and params.min_worker < live
        if not shrink:
            await _settle(mv)
        if params.tuned():
            mv.configure(**params.tuning)
        if params.min_worker is None:
            state.changed()
        else:
            # One snapshot, holding the new counts at once, as TorchServe's: a restart while
            # the workers start (an asynchronous scale answered 202) restores them.
            await mv.scale(params.min_worker, params.max_worker, resized=state.changed)
    return shrink


async def scale(
    state: Management, name: str, version: str | None, raw: Mapping[str, Any]
) -> Status:
    """Tune the live settings and scale the workers of one version (the default one when
    ``version`` is None) as the parameters in ``raw`` say (``plane.params.scale_params``);
    asynchronously (202) unless they ask for ``synchronous``."""
    mv = present(state, name, version)
    params = scale_params(raw)
    if not params.synchronous:
        task = asyncio.ensure_future(_scale(state, mv, params))
        _background.add(task)
        task.add_done_callback(_scale_done)
        return Status("Processing worker updates...", 202)
    shrunk = await _scale(state, mv, params)
    if mv.closing:  # unregistered, or the server stopped, while the workers started
        raise ShuttingDown(stopping_message(mv, "was stopped", "; the workers were not scaled"))
    if params.min_worker is None:
        return Status(f"Model {mv.name} version {mv.version} updated")
    # TorchServe 0.12 (ApiUtils.updateModelWorkers): 200 when scaled (down: at once), 500 when
    # starting the workers failed, 206 when they are not all up yet.
    if mv.ready_workers < params.min_worker and not shrunk:
        if mv.load_error is not None:
            log.warning("model %s: scaling failed: %s", mv.key, mv.load_error)
            failed = f"Failed to start workers for model {mv.name} version: {mv.version}"
            raise TorchbayError(failed)
        return Status("Workers scaling in progress...", 206)
    scaled = f"Workers scaled to {params.min_worker} for model: {mv.name}"
    return Status(scaled if version is None else f"{scaled}, version: {version}")


def _scale_done(task: asyncio.Task) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("scaling failed", exc_info=task.exception())


# -- default version, unregister ----------------------------------------------------------------


def set_default(state: Management, name: str, version: str) -> Status:
    leaving = state.registry.models.get(name, {}).get(version)
    if leaving is not None and leaving.leaving:  # as present(), in set-default's words
        raise ModelVersionNotFound(f"Model version {version} does not exist for model {name}")
    state.registry.set_default(name, version)
    state.changed()
    return Status(f'Default version successfully updated for model "{name}" to "{version}"')


async def unregister(state: Management, name: str, version: str | None) -> Status:
    """Drain and unregister one version (the default one when ``version`` is None)."""
    registry, timeout = state.registry, state.config.unregister_model_timeout_s
    versions = registry.models.get(name) or {}
    target = versions.get(version if version is not None else registry.defaults.get(name, ""))
    if target is None:
        # Unknown model (404) or version (400, as TorchServe): the registry says which.
        await registry.unregister(name, version, timeout)
        raise NotFound(f"Model not found: {name}")
    present(state, name, target.version)  # one being unregistered already: 404 at once
    # Not in the version's management turn: as TorchServe's, an unregister does not wait for a
    # scale whose workers are still loading; it stops them (that scale answers 503).
    await registry.unregister(name, target.version, timeout)
    state.changed()
    return Status(f'Model "{name}" unregistered')
