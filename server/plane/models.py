"""The data plane's model operations: the Open Inference Protocol's model metadata and the Triton
extensions torchbay supports, for every protocol (REST: ``http/triton.py``; gRPC: ``grpc/oip.py``
and ``grpc/triton.py``). Each returns plain data (Triton's JSON shapes) or raises the error tree:

* model metadata ``GET /v2/models/{m}[/versions/{v}]``: name, versions, platform and the tensor
  signature (``serving.archives.signature_of``: recorded by the archiver, overridable in
  model-config.yaml);
* statistics ``GET /v2/models[/{m}[/versions/{v}]]/stats`` (``observe.oip_stats``);
* model configuration ``GET /v2/models/{m}[/versions/{v}]/config``: a Triton-style config built
  from the version's settings and signature (``triton_config.py``);
* model repository ``POST /v2/repository/index``, ``.../models/{m}/load``, ``.../unload``: the
  model store's archives; load and unload call the registry's register / unregister.

Index, load and unload need the management key (the adapters check it); load and unload also
need the model API (``enable_model_api``, else 405, as the management API answers). Torch-free.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from torchbay.server.errors import (
    BadRequest,
    ConfigError,
    MethodNotAllowed,
    ModelNotFound,
    TorchbayError,
)
from torchbay.server.observe.oip_stats import OipStats
from torchbay.server.plane.cache import ResponseCache
from torchbay.server.plane.load_config import check_fixed, fixed_fields, load_overrides
from torchbay.server.plane.triton_config import model_config, platform, signature
from torchbay.server.serving.archives import ArchiveError, Manifest, read_manifest
from torchbay.server.serving.handle import WorkerLoadError
from torchbay.server.serving.model import ModelStatus, ModelVersion
from torchbay.server.serving.registry import ModelRegistry
from torchbay.server.serving.store import ARCHIVE_SUFFIXES, identity


def model_metadata(registry: ModelRegistry, mv: ModelVersion) -> dict[str, Any]:
    """OIP ``$metadata_model_response``."""
    sig = signature(mv)
    meta: dict[str, Any] = {
        "name": mv.name,
        "versions": sorted(registry.models.get(mv.name, {})),
        "platform": platform(mv),
        **(sig.to_json() if sig is not None else {"inputs": [], "outputs": []}),
    }
    if sig is not None and sig.inputs_by_position:
        # The input names are the archiver's, not declared: requests may name them otherwise.
        meta["parameters"] = {"inputs_by_position": True}
    return meta


class Models:
    """The model operations over one registry and one statistics accumulator."""

    def __init__(
        self,
        registry: ModelRegistry,
        stats: OipStats,
        *,
        model_api: bool = False,
        unload_timeout_s: float = 120.0,
        cache: ResponseCache | None = None,
        lock_for: Callable[[ModelVersion], asyncio.Lock] | None = None,
    ) -> None:
        self.registry = registry
        self.lock_for = lock_for or (lambda mv: asyncio.Lock())  # Management.lock_for
        self.stats = stats
        self.model_api = model_api
        self.unload_timeout_s = unload_timeout_s
        self.cache = cache or ResponseCache()
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # name: its lock, its users
        # Called after a load or unload that changed what runs (TorchServe's config snapshot,
        # as after a register or an unregister: the plane sets it).
        self.changed: Callable[[], object] = lambda: None
        self.startup_failures: dict[str, str] = {}  # the plane's (serve.py sets it)
        self.startup_unloadable: set[str] = set()  # of those, whose workers failed to load
        self.load_failures: dict[str, str] = {}  # a store model's last repository load: why

    # -- metadata, configuration, statistics ----------------------------------------------------

    def metadata(self, name: str, version: str | None) -> dict[str, Any]:
        return model_metadata(self.registry, self.registry.resolve(name, version))

    def config(self, name: str, version: str | None) -> dict[str, Any]:
        return model_config(self.registry.resolve(name, version))

    def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        """``{"model_stats": [...]}``: every version (no name), a model's, or one version's."""
        if not name:
            versions = self.registry.all_versions()
        elif not version:
            self.registry.resolve(name)  # ModelNotFound
            versions = list(self.registry.models[name].values())
        else:
            versions = [self.registry.resolve(name, version)]
        versions.sort(key=lambda mv: (mv.name, mv.version))
        return self.stats.model_stats(versions)

    # -- model repository -----------------------------------------------------------------------

    def control(self) -> None:
        """MethodNotAllowed (405) unless the model API is on (load and unload need it)."""
        if not self.model_api:
            raise MethodNotAllowed(
                "Model API control is disabled: loading and unloading models needs "
                "--enable-model-api (enable_model_api=true)"
            )

    async def _store(self) -> list[tuple[Path, Manifest | None]]:
        """The model store's archives with their manifests (None: unreadable)."""
        if self.registry.config.model_store is None:
            return []

        def read(path: Path) -> Manifest | None:
            try:
                return read_manifest(path)
            except ArchiveError:
                return None

        paths = self.registry.store_archives()
        manifests = await asyncio.to_thread(lambda: [read(p) for p in paths])
        return list(zip(paths, manifests, strict=True))

    def in_store(self, name: str) -> bool:
        """True when the model store has an archive named ``name`` (loaded or not)."""
        return any(_stem(path) == name for path in self.registry.store_archives())

    async def index(self, ready_only: Any = False) -> list[dict[str, str]]:
        """Triton's repository index: loaded versions and the store's other archives."""
        if not isinstance(ready_only, bool):
            raise BadRequest('"ready" must be true or false')
        entries: dict[tuple[str, str], dict[str, str]] = {}
        for mv in self.registry.all_versions():
            entries[(mv.name, mv.version)] = _entry(mv.name, mv.version, *self._state(mv))
        if not ready_only:
            for path, manifest in await self._store():
                name, version = _store_name(path, manifest)
                reason = self._why_unloaded(name) if manifest is not None else "not a valid archive"
                entries.setdefault((name, version), _entry(name, version, "UNAVAILABLE", reason))
        body = [e for e in entries.values() if not ready_only or e["state"] == "READY"]
        return sorted(body, key=lambda e: (e["name"], e["version"]))

    def _why_unloaded(self, name: str) -> str:
        """The index's reason for a store model that is not loaded: its last repository load's
        error, else its start-up load's, else "unloaded", as Triton's index gives a model
        whose load failed that failure (until it loads or is unloaded)."""
        failed = [why for k, why in self.startup_failures.items() if name in (k, _stem(Path(k)))]
        return self.load_failures.get(name) or next(iter(failed), "unloaded")

    def _state(self, mv: ModelVersion) -> tuple[str, str]:
        """A registered version's state and reason in Triton's index. One that loads on demand
        (max_loaded_models) is READY only while it holds a ready worker: unloaded (evicted, or
        registered past the budget) it is Triton's unloaded model, UNAVAILABLE "unloaded" (or
        its last load's error), though still routable (its readiness, multiplex.py)."""
        multiplexer = self.registry.multiplexer
        if mv.leaving or multiplexer is None or mv.demand is None:
            status = mv.status
            state = {ModelStatus.READY: "READY", ModelStatus.LOADING: "LOADING"}.get(
                status, "UNLOADING" if mv.leaving else "UNAVAILABLE"
            )
            return state, "" if state != "UNAVAILABLE" else status.value.lower()
        residency = multiplexer.residency(mv)
        if residency.leaving is not None:
            return "UNLOADING", ""
        if any(slot.ready and slot.may_serve for slot in mv.slots):
            return "READY", ""
        if residency.loading is not None or multiplexer.loaded(mv):
            return "LOADING", ""
        failure = residency.failure
        return "UNAVAILABLE", failure.message if failure is not None else "unloaded"

    async def load(self, name: str, parameters: Any) -> None:
        """Load ``name`` from the model store (every version of it not loaded yet), with a
        ``parameters.config`` override (Triton's ModelConfig JSON fields torchbay takes). Every
        refusal past the model API check says "failed to load '<name>', ...", as Triton's does
        (its model-control examples look for those words)."""
        self.control()
        before = self._running(name)
        try:
            async with self._turn(name):
                await self._load(name, parameters)
        except ConfigError as exc:
            await self._load_failed(name, exc.message)
            raise BadRequest(exc.message, oip_message=_failed(name, exc.message)) from None
        except TorchbayError as exc:
            await self._load_failed(name, exc.oip_text)
            exc.oip_message = _failed(name, exc.oip_text)
            raise
        else:
            self.load_failures.pop(name, None)
        finally:  # a load that failed half-way (a reload) changed what runs, too
            if self._running(name) != before:
                self.changed()

    async def _load_failed(self, name: str, why: str) -> None:
        """Keep why a load of a model of the store failed, for the index (a name the store does
        not have is a client's text: nothing is kept for it)."""
        if any(_store_name(path, mf)[0] == name for path, mf in await self._store()):
            self.load_failures[name] = why

    def _running(self, name: str) -> list[tuple[Any, ...]]:
        """What a snapshot holds of ``name``'s versions: each one, its workers and batching."""
        fields = ("min_workers", "max_workers", "batch_size", "max_batch_delay_ms")
        return [
            (version, id(mv), *(getattr(mv.settings, f) for f in fields))
            for version, mv in sorted(self.registry.models.get(name, {}).items())
        ]

    async def _load(self, name: str, parameters: Any) -> None:
        overrides, workers = load_overrides(name, parameters)
        fixed = fixed_fields(parameters)
        await self.registry.departed(name)  # being unregistered: registered again once gone
        store = [(p, mf) for p, mf in await self._store() if mf is not None]
        candidates = [(p, mf) for p, mf in store if _store_name(p, mf)[0] == name] or [
            (p, mf) for p, mf in store if _stem(p) == name
        ]
        if not candidates:
            raise ModelNotFound(f"Model {name} is not in the model store")
        loaded = self.registry.models.get(name, {})
        if _replaced(candidates, loaded):  # Triton reloads a model whose files changed
            await self._unload_all(name)
            loaded = {}
        if fixed and loaded:  # refused before anything changes
            check_fixed(fixed, [model_config(mv) for mv in loaded.values()])
        if overrides or workers is not None:  # Triton reloads a loaded model with the new config
            changes = (self._turned(mv, _reconfigure, overrides, workers) for mv in loaded.values())
            await asyncio.gather(*changes)
            for mv in loaded.values():  # a reload: no answer of before it is served after it
                self.cache.clear(mv)
        await asyncio.gather(*(self._turned(mv, _serve_again) for mv in loaded.values()))
        todo = [p for p, mf in candidates if _store_name(p, mf)[1] not in loaded]
        for path in todo:
            await self.registry.register(
                path.relative_to(self.registry.config.model_store).as_posix(),
                name=name,
                overrides=overrides,
                initial_workers=workers,
                startup=False,  # describe: loadedAtStartup false
            )
        if fixed and not loaded:  # known once loaded: a mismatch leaves it unloaded
            try:
                check_fixed(fixed, [model_config(mv) for mv in self.registry.models[name].values()])
            except BadRequest:
                await self._unload_all(name)
                raise
        if self.registry.multiplexer is not None:
            await self._load_now(name, registered=bool(todo) and not loaded)

    async def _load_now(self, name: str, registered: bool) -> None:
        """On demand (max_loaded_models): the default version is loaded now, making room, as
        a request would load it; Triton's load answers once it is. One this load ``registered``
        that cannot load is unregistered, as a registration that cannot load is refused."""
        assert self.registry.multiplexer is not None
        try:
            await self.registry.multiplexer.load_now(self.registry.resolve(name))
        except TorchbayError:
            if registered:
                await self._unload_all(name)
            raise

    async def unload(self, name: str, parameters: Any) -> None:
        """Unload every version of ``name`` (the default one last). A start-up model of that
        name that failed to load is forgotten (the server's readiness no longer waits for it),
        as Triton's unload of a model that failed marks it unloaded. A model of the store that
        is not loaded is a success with nothing to do, as Triton's unload of a model not
        loaded ("no affect and success code", tritonserver.h); a name the store does not have
        is a 404 (Triton answers success there too: a typo should be told)."""
        self.control()
        if not isinstance(parameters, dict):
            raise BadRequest('"parameters" must be an object')
        async with self._turn(name):
            failed = [k for k in self.startup_failures if name in (k, _stem(Path(k)))]
            for label in failed:  # Triton: unloaded, so no longer a failure (readiness)
                del self.startup_failures[label]
            self.load_failures.pop(name, None)
            if not self.registry.models.get(name):
                if failed or self.in_store(name):
                    return
                raise ModelNotFound(f"Model not found: {name}")
            try:
                await self._unload_all(name)
            finally:  # one version gone is a change, even when another failed to go
                self.changed()

    @contextlib.asynccontextmanager
    async def _turn(self, name: str) -> AsyncIterator[None]:
        """One repository load or unload of ``name`` at a time, in the order they came, as
        Triton's repository manager takes them: a second load while one is under way waited
        for nothing and was a 409 (already registered), an unload meanwhile a 404 (the model
        left loaded), and concurrent config changes left whichever finished last. The lock
        is dropped once no request holds or awaits it (a name is a client's text)."""
        lock, users = self._turns.get(name, (asyncio.Lock(), 0))
        self._turns[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._turns[name]
            if users == 1:
                del self._turns[name]
            else:
                self._turns[name] = (lock, users - 1)

    async def _turned(self, mv: ModelVersion, work: Callable[..., Awaitable], *args: Any) -> None:
        """``work(mv, *args)`` in the version's management turn (a TorchServe scale or
        unregister of it runs wholly before or after); nothing if it was unregistered meanwhile."""
        async with self.lock_for(mv):
            if not mv.closing:
                await work(mv, *args)

    async def _unload_all(self, name: str) -> None:
        versions = dict(self.registry.models.get(name, {}))
        default = self.registry.defaults.get(name)
        # The default version goes last: the registry keeps it while others remain.
        for version in sorted(versions, key=lambda v: v == default):
            mv = versions[version]
            async with self.lock_for(mv):  # after a TorchServe scale or unregister of it
                if self.registry.models.get(name, {}).get(version) is not mv:
                    continue  # unregistered meanwhile
                self.cache.clear(mv)
                await self.registry.unregister(name, version, self.unload_timeout_s)


async def _reconfigure(mv: ModelVersion, overrides: dict[str, Any], workers: int | None) -> None:
    """A loaded version takes a load request's new config in place, as a live change: its
    batching at once, its worker count by scaling (new workers start before old ones retire,
    and no queued request is lost), so it serves throughout, where Triton's reload swaps in a
    new instance of the model."""
    delay = overrides.get("max_batch_delay")
    mv.configure(batch_size=overrides.get("batch_size"), max_batch_delay_ms=delay)
    cache = overrides.get("response_cache")
    if cache is not None and mv.config is not None:  # read per request (plane/cache.py)
        mv.config = mv.config.model_copy(update={"response_cache": cache})
    if workers is not None:
        await mv.scale(workers)


async def _serve_again(mv: ModelVersion) -> None:
    """A loaded version held at zero workers (registered with none, scaled to zero) or whose
    workers gave up (FAILED) starts again, at least one worker, as Triton's load of a model
    that is not ready loads it: the load answered 200 and left it answering 503. A worker that
    cannot load fails the load. One being unregistered (its slots retiring: FAILED for now)
    is left to go: a slot started on it would outlive it."""
    if mv.closing or mv.status not in (ModelStatus.STOPPED, ModelStatus.FAILED):
        return
    await mv.scale(max(1, mv.settings.min_workers))
    if mv.status is not ModelStatus.READY:
        raise WorkerLoadError(mv.load_error or "no worker could load the model")


def _replaced(candidates: list[tuple[Path, Manifest]], loaded: dict[str, ModelVersion]) -> bool:
    """Whether the store holds another file now for a loaded version's archive (another size
    or modification time): Triton's load reloads a model whose files changed, from the store
    and the request's config; a model folder served in place is not compared."""
    for path, manifest in candidates:
        mv = loaded.get(_store_name(path, manifest)[1])
        if mv is not None and mv.source is not None and identity(path) != mv.source:
            return True
    return False


def _failed(name: str, why: str) -> str:
    return f"failed to load '{name}', {why}"


def _entry(name: str, version: str, state: str, reason: str) -> dict[str, str]:
    return {"name": name, "version": version, "state": state, "reason": reason}


def _stem(path: Path) -> str:
    name = path.name
    for suffix in ARCHIVE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _store_name(path: Path, manifest: Manifest | None) -> tuple[str, str]:
    if manifest is None:
        return _stem(path), ""
    return manifest.model.model_name or _stem(path), str(manifest.model.model_version or "1.0")
