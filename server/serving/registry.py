"""The model registry: names -> versions -> ModelVersion, the default version, load and unload.

Archives come from the model store (or, through ``fetch``, from an allowed URL); each is unpacked
once, with hash checks, into the server's work folder and shared by all its workers. Torch-free.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from torchbay.server.config.metrics_config import handler_metrics, load_metrics_config
from torchbay.server.config.settings import ModelConfig, ServerConfig
from torchbay.server.errors import (
    BadRequest,
    Conflict,
    DefaultVersionInUse,
    ModelNotFound,
    ModelVersionNotFound,
    ShuttingDown,
)
from torchbay.server.serving import store
from torchbay.server.serving.archives import (
    ArchiveError,
    Manifest,
    extract_archive,
    handler_spec_problem,
    read_manifest,
    signature_of,
)
from torchbay.server.serving.budget import HostBudget
from torchbay.server.serving.handle import Spawned, SpawnFn, WorkerLoadError
from torchbay.server.serving.launch import LaunchSpec, Placement, server_facts, settings_from
from torchbay.server.serving.model import ModelVersion, Observer
from torchbay.server.serving.multiplex import Multiplexer

log = logging.getLogger("torchbay.registry")

# (model version, slot index, model config) -> where that worker runs
PlaceFn = Callable[[ModelVersion, int, ModelConfig], Placement]
# url -> local archive path (remote registration; see serving.fetch)
FetchFn = Callable[[str], Awaitable[Path]]
Registered = Callable[[ModelVersion], object]  # register's: a version is in the registry


class ModelRegistry:
    def __init__(
        self,
        config: ServerConfig,
        *,
        place: PlaceFn,
        server_version: str,
        budget: HostBudget | None = None,  # None: no host budget (workers keep their place)
        observer: Observer | None = None,
        fetch: FetchFn | None = None,
        workdir: Path | None = None,
        worker_env: dict[str, str] | None = None,
        prewarmed: Callable[[], Spawned | None] | None = None,
        spawn: SpawnFn | None = None,  # how workers start (serving/forkserver.py); None: spawned
        unplace: Callable[[str], None] | None = None,  # a version gone: its placement state
    ) -> None:
        self.config = config
        self.unplace = unplace
        self.gpus = 0  # the GPUs workers are placed on (serve.py sets it): describe's deviceType
        self.prewarmed = prewarmed
        self.spawn = spawn
        self.place = place
        self.budget = budget or HostBudget(None, (), enabled=False)
        self.server_version = server_version
        self.observer = observer
        self.fetch = fetch
        self.worker_env = worker_env
        self.model_metrics = handler_metrics(load_metrics_config(config.metrics_config))
        self._owns_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="torchbay-models-"))
        self.models: dict[str, dict[str, ModelVersion]] = {}
        self.defaults: dict[str, str] = {}
        self.startup_models: set[str] = set()  # "name/version" registered at start-up
        self._lock = asyncio.Lock()
        # Many models per host: None unless max_loaded_models is set (serving/multiplex.py).
        limit = config.max_loaded_models
        self.multiplexer = Multiplexer(limit, self.all_versions) if limit else None

    # -- lookup ---------------------------------------------------------------------------------

    @property
    def model_configs(self) -> dict[str, ModelConfig]:
        """Each version's resolved config (live changes included), by "name/version"."""
        return {mv.key: mv.config for mv in self.all_versions() if mv.config is not None}

    def resolve(self, name: str, version: str | None = None) -> ModelVersion:
        versions = self.models.get(name)
        if not versions:
            triton = f"Request for unknown model: '{name}' is not found"
            raise ModelNotFound(f"Model not found: {name}", oip_message=triton)
        version = self.defaults[name] if version is None else version
        try:
            return versions[version]
        except KeyError:
            raise ModelVersionNotFound(
                f"Model version: {version} does not exist for model: {name}",
                oip_message=ModelVersionNotFound.triton_text(name, version),
            ) from None

    def all_versions(self) -> list[ModelVersion]:
        return [mv for versions in self.models.values() for mv in versions.values()]

    def is_default(self, mv: ModelVersion) -> bool:
        return self.defaults.get(mv.name) == mv.version

    # -- registration ---------------------------------------------------------------------------

    def store_archives(self) -> list[Path]:
        """Every archive in the model store (``load_models=all``)."""
        return store.store_archives(self.config.model_store)

    async def register(
        self,
        url: str,
        *,
        name: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        initial_workers: int | None = None,
        synchronous: bool = True,
        default_workers: int | None = None,
        startup: bool = True,
        registered: Registered | None = None,
    ) -> ModelVersion:
        """Unpack, configure and start one model version. Raises Conflict, BadRequest, load errors.

        With ``synchronous=False`` the workers start in the background and this returns as soon
        as the version is registered (status LOADING). ``default_workers`` replaces the server's
        ``default_workers_per_model`` when neither ``initial_workers`` nor the archive's config
        says (the management API passes TorchServe's 0). ``startup=False``: through an API, not
        at start-up (``loadedAtStartup``). ``registered(mv)``: once in, before workers start.
        """
        if not url:
            raise ModelNotFound("empty url")  # TorchServe's answer
        downloaded = url.startswith(("http://", "https://"))
        if downloaded:
            if self.fetch is None:
                raise BadRequest("Registering from a URL is not enabled (allowed_urls)")
            path = await self.fetch(url)
        else:  # an absolute directory only at start-up: the operator's, not an API client's
            given = store.startup_directory(url) if startup else None
            path = given or store.archive_path(self.config.model_store, url)
        try:
            api = dict(overrides or {})
            if initial_workers is not None:
                api["initial_workers"] = initial_workers
            mv = await self._register(
                path, url, name, api, default_workers, synchronous, not startup, registered
            )
            if startup:
                self.startup_models.add(mv.key)
            return mv
        finally:
            if downloaded:  # unpacked (or refused): the download is never needed again
                store.remove(path)

    async def register_local(
        self,
        path: Path,
        *,
        name: str,
        overrides: Mapping[str, Any],
        registered: Registered | None = None,
    ) -> ModelVersion:
        """Register a folder the server made, a workflow's function node (``server/workflows``):
        its URL is empty (no model list shows it, as TorchServe's), never a start-up model."""
        return await self._register(path, "", name, dict(overrides), None, True, False, registered)

    async def _register(
        self,
        path: Path,
        url: str,
        name: str | None,
        overrides: Mapping[str, Any],
        default_workers: int | None,
        synchronous: bool,
        from_api: bool,
        registered: Registered | None,
    ) -> ModelVersion:
        loose = store.is_model_directory(path)
        manifest, overrides = await self._manifest(path, loose, name, overrides)
        name = name or manifest.model.model_name
        version = str(manifest.model.model_version or "1.0")
        store.check_name_and_version(name, version)
        await self.departed(name, version)  # being unregistered: registered again once gone
        async with self._lock:
            if version in self.models.get(name, {}):
                raise Conflict(f"Model version {version} is already registered for model {name}")
            model_dir = self.workdir / f"{name}-{version}-{uuid.uuid4().hex[:8]}"
            try:
                if loose:  # served in place, as TorchServe links it; never copied nor removed
                    model_dir.parent.mkdir(parents=True, exist_ok=True)
                    model_dir.symlink_to(path.resolve(), target_is_directory=True)
                else:
                    await asyncio.to_thread(
                        extract_archive,
                        path,
                        model_dir,
                        max_total_bytes=self.config.max_archive_expanded_size,
                        max_ratio=self.config.max_archive_compression_ratio,
                    )
                config = store.model_config(
                    self.config, name, version, model_dir, manifest, overrides, default_workers, url
                )
                signature_of(manifest, config.handler_config)  # ArchiveError: a bad signature
            except ArchiveError as exc:
                store.remove(model_dir)
                raise BadRequest(str(exc)) from None
            except BaseException:  # nothing of a refused archive stays in the work folder
                store.remove(model_dir)
                raise
            mv = self._new_version(name, version, model_dir, config, manifest, url)
            mv.source = store.identity(path)
            self.models.setdefault(name, {})[version] = mv
            if name not in self.defaults or config.default_version:
                self.defaults[name] = version
            if registered is not None:
                registered(mv)
        if synchronous:
            await self._start(mv, from_api=from_api)
        else:
            task = asyncio.ensure_future(self._start(mv, quiet=True, from_api=from_api))
            _background.add(task)
            task.add_done_callback(_background.discard)
        return mv

    async def _manifest(
        self, path: Path, loose: bool, name: str | None, overrides: Mapping[str, Any]
    ) -> tuple[Manifest, Mapping[str, Any]]:
        """The archive's manifest (made up for a model directory), and the overrides with
        ``default_service_handler`` as the handler when the manifest names none."""
        handler = overrides.get("handler")
        why = handler_spec_problem(str(handler)) if handler else None
        if why is not None:
            # Only the server's default_service_handler may name a file outside the archive.
            raise BadRequest(f"handler must be a module or a file inside the archive: {why}")
        try:
            manifest: Manifest = (
                store.directory_manifest(path, name)
                if loose
                else await asyncio.to_thread(read_manifest, path)
            )
        except ArchiveError as exc:
            raise BadRequest(str(exc)) from None
        if not manifest.model.handler and self.config.default_service_handler:
            overrides = {"handler": self.config.default_service_handler, **overrides}
        if not manifest.model.handler and not overrides.get("handler"):
            # a worker could only fail to load it (a 500 for the operator's mistake)
            raise BadRequest(
                "the model names no handler: give the handler parameter, or archive it with "
                "--handler (or set default_service_handler)"
            )
        return manifest, overrides

    def _new_version(
        self,
        name: str,
        version: str,
        model_dir: Path,
        config: ModelConfig,
        manifest: Manifest,
        url: str,
    ) -> ModelVersion:
        """A model version from its resolved config: its live settings and its launch spec."""
        return ModelVersion(
            name=name,
            version=version,
            model_dir=model_dir,
            settings=settings_from(config, self.config),
            config=config,
            place=lambda m, i: self.place(m, i, config),
            retune=lambda: self.budget.rebalance(self.all_versions()),
            launch=LaunchSpec(
                model_dir=model_dir,
                model_name=name,
                model_version=version,
                handler=config.handler,
                server_version=self.server_version,
                env=self.worker_env,
                **server_facts(self.config),
                model_metrics=self.model_metrics,
            ),
            url=url,
            manifest=manifest,
            observer=self.observer,
            prewarmed=self.prewarmed,
            spawn=self.spawn,
        )

    async def _start(self, mv: ModelVersion, quiet: bool = False, from_api: bool = False) -> None:
        """Start ``mv``'s workers (or place it in the loaded-models budget); one that cannot
        start is forgotten, unless an API registered it asynchronously (202): FAILED, kept."""
        multiplexer = self.multiplexer
        keep = quiet and from_api and multiplexer is None
        try:
            if multiplexer is None:
                await mv.start(keep=keep)
            else:
                await multiplexer.start(mv, refuse_unloadable=from_api)
        except Exception as exc:
            if not (keep and isinstance(exc, WorkerLoadError) and not mv.closing):
                self._forget(mv)
            if not quiet:
                raise
            if isinstance(exc, ShuttingDown):  # unregistered (or the server stopped) meanwhile
                log.info("model %s: %s", mv.key, exc)
            else:
                log.error("model %s failed to load", mv.key, exc_info=True)
            return
        self.budget.rebalance(self.all_versions())  # catch up workers that loaded meanwhile
        log.info(
            "model %s ready: %d worker(s) on %s, batch_size=%d, max_batch_delay=%gms",
            mv.key,
            mv.ready_workers,
            ", ".join(sorted({s.worker.device for s in mv.slots if s.worker})) or "-",
            mv.settings.batch_size,
            mv.settings.max_batch_delay_ms,
        )

    def _forget(self, mv: ModelVersion) -> None:
        versions = self.models.get(mv.name, {})
        if versions.get(mv.version) is mv:
            del versions[mv.version]
            self.startup_models.discard(mv.key)
        if not versions:
            self.models.pop(mv.name, None)
            self.defaults.pop(mv.name, None)
        elif self.defaults.get(mv.name) == mv.version:
            self.defaults[mv.name] = sorted(versions)[-1]
        store.remove(mv.model_dir)  # a model directory's link only
        if self.unplace is not None:  # registered again, it starts at deviceIds[0] (TorchServe)
            self.unplace(mv.key)
        self.budget.rebalance(self.all_versions())  # its threads go to the others

    async def unregister(self, name: str, version: str | None = None, timeout: float = 120) -> None:
        """Drain then stop one version. The default version goes only when it is the last."""
        versions = self.models.get(name)
        if not versions:
            raise ModelNotFound(f"Model not found: {name}")
        version = version or self.defaults[name]
        mv = versions.get(version)
        if mv is None:  # TorchServe: 404 ModelVersionNotFoundException
            raise ModelVersionNotFound(f"Model version: {version} does not exist for model: {name}")
        if self.defaults.get(name) == version and sum(not v.leaving for v in versions.values()) > 1:
            raise DefaultVersionInUse(f"Cannot remove default version for model {name}")
        await self.remove(mv, timeout, checked=True)

    async def remove(self, mv: ModelVersion, timeout: float, checked: bool = False) -> None:
        """Drain then stop exactly ``mv``, the default or not (a workflow's node: the version it
        registered, whatever versions were added since), unless it is gone or going already."""
        if not checked and (mv.leaving or self.models.get(mv.name, {}).get(mv.version) is not mv):
            return
        mv.leaving = True
        try:  # a worker still busy past the drain runs requests answered 503: stopped at once
            await mv.stop(10.0 if await mv.drain(timeout) else 1.0)
        except BaseException:
            mv.leaving = False  # still registered (TorchServe puts a version back, too)
            raise
        self._forget(mv)

    async def departed(self, name: str, version: str | None = None) -> None:
        """Return once no version of ``name`` (or ``version``) is being unregistered (bounded)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.config.unregister_model_timeout_s + 30
        while loop.time() < end and any(
            mv.leaving and version in (None, v) for v, mv in self.models.get(name, {}).items()
        ):
            await asyncio.sleep(0.05)

    def set_default(self, name: str, version: str) -> None:
        if name in self.models and version not in self.models[name]:  # TorchServe's wording
            raise ModelVersionNotFound(f"Model version {version} does not exist for model {name}")
        mv = self.resolve(name, version)
        self.defaults[name] = mv.version

    # -- shutdown -------------------------------------------------------------------------------

    async def drain(self, timeout: float, hurry: asyncio.Event | None = None) -> None:
        """Drain every version (the server stops; ``hurry`` set: at once), then stop the
        workers still starting."""
        await asyncio.gather(*(mv.drain(timeout, hurry) for mv in self.all_versions()))
        await asyncio.gather(*(mv.stop_starting() for mv in self.all_versions()))

    async def stop(self, timeout: float = 10.0) -> None:
        await asyncio.gather(*(mv.stop(timeout) for mv in self.all_versions()))
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


_background: set[asyncio.Task] = set()
