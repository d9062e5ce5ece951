"""The data plane: what every protocol asks of the server, answered once.

TorchServe REST, the Open Inference Protocol over REST and gRPC, KServe v1, Triton's extensions,
TorchServe's gRPC inference and management: each is an adapter that parses its wire format,
calls the :class:`DataPlane`, and writes what comes back (or the one error tree of
``server/errors.py``) in its own format. The plane owns the request's steps
(:meth:`DataPlane.exchange`, ``plane/exchange.py``), health and readiness, server and model
metadata, the model configuration, the statistics, the model repository (``plane/models.py``),
the response cache (``plane/cache.py``)
and the model management operations (``plane/management.py``); recording (metrics, Triton
statistics, access line) happens inside it, once, whatever protocol brought the request.

Each protocol's list of extensions is derived from what that adapter serves
(:func:`extensions_of`): an extension is advertised only where all of its operations are.

``serve.py`` builds one plane (:func:`build_plane`) and hands it to every listener. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from torchbay.server.config.settings import ServerConfig
from torchbay.server.errors import BadRequest, ServiceUnavailable, TorchbayError
from torchbay.server.observe.logs import RequestHook, request_hook
from torchbay.server.observe.metrics import ServerMetrics
from torchbay.server.observe.oip_stats import Observers, OipStats, chain
from torchbay.server.observe.ts_families import metrics_options
from torchbay.server.plane import log_settings
from torchbay.server.plane.cache import ResponseCache
from torchbay.server.plane.exchange import Exchange, Scope, Wiring
from torchbay.server.plane.management import Management
from torchbay.server.plane.models import Models
from torchbay.server.plane.shm import SharedMemory
from torchbay.server.plane.snapshots import Snapshots
from torchbay.server.plane.trace import Tracer
from torchbay.server.serving.admission import any_pressed, refuse_early
from torchbay.server.serving.fetch import Fetcher
from torchbay.server.serving.model import ModelStatus, ModelVersion
from torchbay.server.serving.registry import ModelRegistry

# Each OIP/Triton extension and the plane operations an adapter must serve to advertise it.
EXTENSIONS: dict[str, frozenset[str]] = {
    "binary_tensor_data": frozenset({"infer"}),
    "classification": frozenset({"infer"}),
    "sequence": frozenset({"infer"}),  # sequence_id/start/end: plane/sequence_params.py
    "schedule_policy": frozenset({"infer"}),  # priority and timeout: plane/schedule.py
    "model_configuration": frozenset({"model_config"}),
    "model_repository": frozenset({"repository_index", "repository_load", "repository_unload"}),
    "statistics": frozenset({"model_stats"}),
    "logging": frozenset({"log_settings"}),
    "system_shared_memory": frozenset({"shm_status", "shm_register", "shm_unregister"}),
    "cuda_shared_memory": frozenset(
        {"cuda_shm_status", "cuda_shm_register", "cuda_shm_unregister"}
    ),
    "trace": frozenset({"trace_settings"}),
}


def extensions_of(served: Iterable[str]) -> list[str]:
    """The extensions whose every operation is in ``served`` (an adapter's operations)."""
    have = set(served)
    return [name for name, needs in EXTENSIONS.items() if needs <= have]


class DataPlane:
    """One per server: the registry, the recorders, and every operation a protocol calls."""

    def __init__(
        self,
        registry: ModelRegistry,
        *,
        server_version: str,
        metrics: ServerMetrics | None = None,
        stats: OipStats | None = None,
        model_api: bool = False,
        unload_timeout_s: float = 120.0,
        config: ServerConfig | None = None,
    ) -> None:
        self.registry = registry
        self.server_version = server_version
        self.metrics = metrics
        self.stats = stats or OipStats()
        # Model management: list, describe, register, scale, set-default (plane/management.py).
        config = config or registry.config
        self.sequence_headers = config.sequence_headers  # their names: id, start, end
        self.management = Management(registry, config)
        # TorchServe's config snapshots, after each management change (plane/snapshots.py).
        self.snapshots = Snapshots(config, registry)
        self.shm = _shared_memory(config)
        self.shm.cuda_gone = partial(_keep_cuda_regions, registry)
        # The response cache of the versions that enable it (plane/cache.py), counted in the
        # statistics' cache_hit / cache_miss and the metrics' torchbay_cache_*.
        self.cache = ResponseCache(self._cache_counted)
        self.management.changed = self._changed
        if metrics is not None:
            metrics.cache.watch(self.cache.sizes)
        # Metadata, model configuration, statistics and the model repository (plane/models.py).
        self.models = Models(
            registry,
            self.stats,
            model_api=model_api,
            unload_timeout_s=unload_timeout_s,
            cache=self.cache,
            lock_for=self.management.lock_for,
        )
        self.models.changed = self._changed  # a repository load or unload: a snapshot
        recorders = [metrics.request_done] if metrics is not None else []
        # Metrics, statistics and the access line, once per answered request of any protocol.
        self.record: RequestHook = request_hook(chain(*recorders, self.stats.request_done))
        # Start-up (serve.py): not ready while the models asked for at start are loading, nor
        # while one of them failed (``startup_failures``: until it loads or is unloaded).
        self.starting = False
        self._log_level = log_settings.level_set()  # put back by ``close``
        # Triton's trace extension: its settings, and the traces of the requests it samples.
        self.tracer = Tracer(str(getattr(config, "trace_file", "") or ""))
        self.wiring = Wiring(
            registry,
            self.record,
            self.shm.hold,
            self.tracer,
            self.cache,
            lambda: self.starting,
            self.shm.release,
        )

    # -- requests -------------------------------------------------------------------------------

    def exchange(self, scope: Scope, name: str, version: str | None) -> Exchange:
        """One inference request's steps and its one record (``plane/exchange.py``)."""
        return Exchange(self.wiring, scope, name, version)

    def invocation_model(self, named: str | None, form: str | None = None) -> str:
        """The model SageMaker's ``POST /invocations`` serves: the one ``named`` (the
        ``model_name`` query parameter or header), else the only model loaded at start-up, as
        TorchServe picks it (``getStartupModels``), else the one its ``form`` field
        ``model_name`` names; else 400 with TorchServe's message, or an empty ``named``
        (``?model_name=``) looked up as TorchServe looks it up: 404. A start-up model that
        failed still counts, as TorchServe keeps it registered: the only one is a 503 naming
        it, never another model's answer nor a 400 blaming the client."""
        chosen = self._invocation_default(named)
        if chosen is not None:
            return chosen
        if form is not None:
            return form
        failed = self._failed_startup_models()
        if not self.registry.startup_models and len(failed) == 1:
            raise ServiceUnavailable(
                f"The start-up model {failed[0]} did not load (see the server's log): "
                "no model serves /invocations"
            )
        raise BadRequest("Parameter model_name is required.")

    def invocation_reads_form(self, named: str | None) -> bool:
        """Whether :meth:`invocation_model` would look at the form field: only then is an
        ``/invocations`` body read for it (never to be ignored for the one start-up model)."""
        try:
            return self._invocation_default(named) is None
        except ServiceUnavailable:
            return False  # answered by invocation_model itself

    def _invocation_default(self, named: str | None) -> str | None:
        """What names the model before any form field (None: nothing; 503 while loading)."""
        if named:
            return named
        names = {key.rpartition("/")[0] for key in self.registry.startup_models}
        if len(names) == 1 and not self._failed_startup_models():
            return names.pop()
        if not names and self.starting:  # TorchServe: its model has no worker yet (503)
            raise ServiceUnavailable("The start-up models are still loading")
        return named  # "" (an empty ?model_name=): looked up, a 404; None: not named

    def _failed_startup_models(self) -> list[str]:
        """The start-up models that failed and are not loaded since (as ``ready`` reads them)."""
        versions = self.registry.all_versions()
        loaded = {mv.name for mv in versions} | {mv.url for mv in versions}
        return [
            label
            for label in self.startup_failures
            if not label.startswith("workflow ") and label not in loaded
        ]

    def _changed(self) -> None:
        """After a management change: TorchServe's config snapshot, and the answers of a version
        it unregistered freed then (not at a later scrape, which may never come)."""
        self.snapshots.save()
        self.cache.sweep()

    def _cache_counted(self, mv: ModelVersion, hit: bool, seconds: float) -> None:
        """One response cache look-up, counted in the statistics and the metrics."""
        self.stats.cache_done(mv, hit, seconds)
        if self.metrics is not None:
            self.metrics.cache.done(mv, hit)

    def pressed(self, name: str, version: str | None) -> ModelVersion | None:
        """The model version named when it refused a request in the last second
        (``Admission.pressed``), else None (also for an unknown one: the full path answers it).
        While nothing refuses anywhere this is one clock read: the hot path's only cost."""
        if not any_pressed():
            return None
        versions = self.registry.models.get(name)
        if not versions:
            return None
        mv = versions.get(version if version is not None else self.registry.defaults.get(name, ""))
        if mv is None or not mv.admission.pressed or self.cache.of(mv) is not None:
            return None  # a cached version's request may be a hit, answered whatever the load
        return mv

    def refusal(
        self, scope: Scope, mv: ModelVersion, name: str, version: str | None
    ) -> TorchbayError | None:
        """The 503 to answer at once, from the headers alone, for a request to the pressed
        ``mv`` (``pressed``; the adapter has checked its key), recorded like any answer; None
        when ``mv`` takes this one after all."""
        ex = self.exchange(scope, name, version)
        ex.model = mv
        try:
            refuse_early(mv)
        except TorchbayError as exc:
            ex.status = exc.status
            ex.close()
            # Returned, not raised: without its traceback, whose frames (the caller's holding
            # this very error) would make a reference cycle per refusal, left to the garbage
            # collector (a collection every few dozen refusals under overload).
            return exc.with_traceback(None)
        return None

    # -- health and readiness -------------------------------------------------------------------

    def model(self, name: str, version: str | None = None) -> ModelVersion:
        """The model version named (404 / 400 from the error tree)."""
        return self.registry.resolve(name, version or None)

    def healthy(self) -> bool:
        """TorchServe's ``/ping`` and gRPC ``Ping``: the start-up models are in (TorchServe
        listens only then), none of them failed (until it loads or is unloaded), and every
        default version has at least its ``minWorkers`` healthy workers (``_healthy_workers``),
        or loads on demand (``max_loaded_models``, loaded or not: serving/multiplex.py). A
        start-up model whose workers could not load it is Unhealthy until it loads or is
        unloaded: TorchServe keeps it registered and counts its workers healthy until they have
        failed for ``maxRetryTimeoutInSec``, then answers Unhealthy (tests/data/torchserve/
        ping); here it is not retried, so it is past that at once. An archive
        refused at start is no model of TorchServe's: it changes nothing here."""
        if self.starting:  # a start-up model not registered yet: its requests would be 404s
            return False
        unloadable = self.models.startup_unloadable
        if any(label in unloadable for label in self._failed_startup_models()):
            return False
        defaults = (self.registry.models[n][v] for n, v in self.registry.defaults.items())
        return all(
            mv.demand is not None or _healthy_workers(mv) >= mv.settings.min_workers
            for mv in defaults
        )

    def ready(self) -> bool:
        """OIP ``/v2/health/ready`` and gRPC ``ServerReady``, the one truth: the models asked
        for at start are loaded (none asked: ready, as Triton is with no model), none of them
        failed, and every loaded version is READY (Triton's strict readiness; a version held at
        zero workers on request is healthy for ``/ping`` but not ready). A start-up model
        that failed counts no more once a model of its name or URL is loaded after all (a
        repository load, a registration), as Triton's strict readiness reads the model's
        state now, not its first load's."""
        if self.starting:
            return False
        # A version being unregistered is no loaded model of the server's any more.
        versions = [mv for mv in self.registry.all_versions() if not mv.leaving]
        loaded = {mv.name for mv in versions} | {mv.url for mv in versions}
        if any(label not in loaded for label in self.startup_failures):
            return False
        return all(mv.status is ModelStatus.READY for mv in versions)

    @property
    def startup_failures(self) -> dict[str, str]:
        """The start-up models that failed: label (name or URL) to reason. The repository's
        (``Models``): an unload of one forgets it, as Triton's of a model that failed."""
        return self.models.startup_failures

    @startup_failures.setter
    def startup_failures(self, failures: dict[str, str]) -> None:
        self.models.startup_failures = failures

    def model_names(self) -> list[str]:
        """The registered models' names (KServe v1's ``GET /v1/models``)."""
        return sorted(self.registry.models)

    def model_ready(self, name: str, version: str | None = None) -> tuple[ModelVersion, bool]:
        mv = self.model(name, version)
        return mv, mv.status is ModelStatus.READY

    def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Triton's log settings (``plane/log_settings.py``), changed first when ``changes``."""
        return log_settings.current() if changes is None else log_settings.update(changes)

    def trace_settings(
        self, model: str | None = None, changes: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Triton's trace settings (``plane/trace.py``), global or ``model``'s, changed first
        when ``changes``. As Triton, a model that is not loaded and ready is a 400."""
        if model:
            versions = self.registry.models.get(model) or {}
            if not any(mv.status is ModelStatus.READY for mv in versions.values()):
                raise BadRequest(f"Request for unknown model : {model}")
        return self.tracer.settings(model, changes)

    def close(self) -> None:
        """The server stopped: the process's log level goes back to what it was at start, and
        the traces held are written."""
        log_settings.restore(self._log_level)
        self.tracer.close()

    def server_metadata(self, served: Iterable[str]) -> dict[str, Any]:
        """OIP ``$metadata_server_response`` for an adapter serving the operations ``served``."""
        return {
            "name": "torchbay",
            "version": self.server_version,
            "extensions": [name for name in extensions_of(served) if self.shm.offers(name)],
        }


def _shared_memory(config: ServerConfig) -> SharedMemory:
    """Triton's shared-memory regions, one registry for every protocol (plane/shm.py)."""
    limits = {"max_regions": config.shm_max_regions, "max_bytes": config.shm_max_bytes}
    return SharedMemory(allow=config.allow_client_shm, **limits)


def _keep_cuda_regions(registry: ModelRegistry, cuda: dict[str, list[Any]]) -> None:
    """A CUDA region is gone: every running worker closes the handles of all but ``cuda``."""
    for mv in registry.all_versions():
        for slot in mv.slots:
            if slot.worker is not None:
                slot.worker.keep_regions(cuda)


def _healthy_workers(mv: ModelVersion) -> int:
    """The workers TorchServe's ``/ping`` counts healthy (``WorkerThread.isHealthy``): all but
    those failing past their retry window (``maxRetryTimeoutInSec``: a slot that gave up) and
    those being retired. A worker still loading, or restarting within the window, counts:
    TorchServe 0.12 answers Healthy while a registration's or a scale-up's workers load
    (tests/data/torchserve/ping), so a probe does not take the whole server out of
    service for one model's new worker."""
    return sum(1 for slot in mv.slots if not slot.retiring and not slot.gave_up)


def build_plane(
    config: ServerConfig,
    *,
    place: Any,
    budget: Any,
    server_version: str,
    env: Mapping[str, str] | None = None,
    prewarmed: Any = None,
    spawn: Any = None,
    unplace: Any = None,
) -> DataPlane:
    """The server's one plane: its registry (fed to the metrics and the statistics), the
    recorders, and URL registration limited to ``allowed_urls`` (none by default)."""
    metrics = ServerMetrics(
        system_metrics=not config.disable_system_metrics, **metrics_options(config, env or {})
    )
    stats = OipStats()  # Triton's statistics extension: fed by the same records as the metrics
    registry = ModelRegistry(
        config,
        place=place,
        budget=budget,
        server_version=server_version,
        observer=Observers(metrics, stats),
        worker_env=dict(env) if env else None,
        prewarmed=prewarmed,
        spawn=spawn,
        unplace=unplace,
    )
    metrics.watch(registry)
    registry.fetch = Fetcher(
        config.allowed_urls,
        registry.workdir / "downloads",
        max_bytes=config.max_download_size,
        timeout_s=config.download_timeout_s,
    )
    return DataPlane(
        registry,
        server_version=server_version,
        metrics=metrics,
        stats=stats,
        model_api=config.enable_model_api,
        unload_timeout_s=config.unregister_model_timeout_s,
        config=config,
    )
