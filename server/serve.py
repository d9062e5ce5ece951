"""The server's lifecycle: ``serve -> startup -> main loop -> shutdown`` (uvicorn's shape).

Startup binds the three listeners first (port 0 allowed; the bound ports are reported), and only
then builds the apps (which writes the key file), so a start that cannot bind touches nothing of a
server already running there. Every listener speaks HTTP through ``http.limits`` (header and body
timeouts, header limits). It then loads the startup models concurrently; a model that fails to
load is logged with its reason and the others keep serving (``startup_models.py``). Signal
handlers only set a flag; one set during start-up cuts it short (the models still loading are
not waited for) and the server shuts down what started.
Shutdown is bounded: stop accepting, drain queued and running requests for ``shutdown_grace_s``
(what is left gets 503), stop workers (Shutdown -> terminate -> kill), then close the metrics
listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from torchbay import __version__
from torchbay.server import stop_signals
from torchbay.server.config.settings import ModelConfig, ServerConfig, parse_address
from torchbay.server.errors import TorchbayError
from torchbay.server.grpc.calls import Calls
from torchbay.server.grpc.server import GrpcListeners
from torchbay.server.http.asgi import ASGIApp
from torchbay.server.http.combined import CombinedApp
from torchbay.server.http.limits import HttpLimits, protocol_class
from torchbay.server.http.listeners import bind_listeners, check_tls, close_all
from torchbay.server.job_threads import JobThreads
from torchbay.server.plane import build_plane
from torchbay.server.serving.budget import GPU_WORKER_THREADS, HostBudget
from torchbay.server.serving.devices import DeviceAssigner, detect_gpu_count, usable_cores
from torchbay.server.serving.forkserver import EarlyTemplate, ForkServer
from torchbay.server.serving.handle import TERM_GRACE_S, Spawned
from torchbay.server.serving.launch import Placement
from torchbay.server.serving.model import ModelVersion
from torchbay.server.serving.registry import ModelRegistry
from torchbay.server.startup_models import load_startup_models
from torchbay.server.workflows.startup import load_startup_workflows

log = logging.getLogger("torchbay.serve")
# A stop's steps past shutdown_grace_s (docs/shutdown.md, ``stop_bound``): answers still being
# written (uvicorn's graceful shutdown), then the workers: Shutdown, SIGTERM once WORKERS_STOP_S
# passed (at once for one stuck in a batch), SIGKILL TERM_GRACE_S later.
WRITE_GRACE_S = 5.0
WORKERS_STOP_S = 6.0  # an idle worker exits at once, its atexit hooks bounded by 5 s


def stop_bound(grace_s: float) -> float:
    """The longest a SIGTERM stop takes with ``shutdown_grace_s`` = ``grace_s``."""
    return grace_s + WRITE_GRACE_S + WORKERS_STOP_S + TERM_GRACE_S


@dataclass
class Ports:
    inference: int = 0
    management: int = 0
    metrics: int = 0
    grpc_inference: int = 0
    grpc_management: int = 0


@dataclass
class ServerState:
    """What tests and the CLI can observe of a running server."""

    ports: Ports = field(default_factory=Ports)
    started: threading.Event = field(default_factory=threading.Event)  # listeners up, models loaded
    failed_models: dict[str, str] = field(default_factory=dict)


class TorchbayServer:
    def __init__(
        self,
        config: ServerConfig,
        *,
        env: Mapping[str, str] | None = None,
        gpu_count: int | None = None,
        cores: int | None = None,
        ready_file: Path | None = None,
        prewarmed: list[Spawned] | None = None,
        template: EarlyTemplate | None = None,
        listeners: dict[str, socket.socket] | None = None,
    ) -> None:
        self.config = config
        # Sockets bound by the caller (the CLI binds before anything else); else startup binds.
        self._sockets: dict[str, socket.socket] = dict(listeners or {})
        # Worker processes the CLI spawned before the frontend's imports (see serving/handle.py).
        self._prewarmed = list(prewarmed or [])
        self.env = dict(env if env is not None else {})
        # ``gpu_count``: the GPUs visible here (tests), else detected; number_of_gpu caps them
        # (TorchServe: min(detected, number_of_gpu)), never adds GPUs the host does not have.
        if gpu_count is None:
            gpu_count = 0 if config.number_of_gpu == 0 else detect_gpu_count(self.env)
        if config.number_of_gpu is not None:
            gpu_count = min(gpu_count, config.number_of_gpu)
        self.gpu_count = gpu_count
        # New workers fork from a template process (``worker_start``; serving/forkserver.py),
        # the CLI's when it started one before its imports (``template``).
        self.forks = ForkServer.configured(config, self.env or None, template)
        core_ids = usable_cores(cores)
        self.cores = len(core_ids)
        # One budget of CPU threads (and cores) for all workers of all models (serving/budget.py).
        self.budget = HostBudget(config.cpu_thread_budget, core_ids)
        self.ready_file = ready_file
        self.state = ServerState()
        self.assigner = DeviceAssigner(gpu_count)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None  # created inside the running loop
        self._hurry = asyncio.Event()  # a second Ctrl-C: no drain, workers stopped at once
        self._servers: list[tuple[str, uvicorn.Server, socket.socket]] = []
        self._late_loads: set[asyncio.Future[None]] = set()  # past workers_start_timeout_s
        self.registry: ModelRegistry | None = None
        self.plane: Any = None  # plane.DataPlane, once started
        self.metrics: Any = None
        self.auth: Any = None  # http.auth.TokenAuth while token authorization is on
        self.grpc: GrpcListeners | None = None

    # -- placement ------------------------------------------------------------------------------

    def take_prewarmed(self) -> Spawned | None:
        """A pre-warmed worker process for the next worker start, if one is left."""
        while self._prewarmed:
            spawned = self._prewarmed.pop()
            if spawned.proc.poll() is None:
                return spawned
            spawned.sock.close()
        return None

    def _discard_prewarmed(self) -> None:
        leftovers, self._prewarmed = self._prewarmed, []
        for spawned in leftovers:  # idle, never sent a Load: nothing to lose, no wait for its
            spawned.proc.kill()  # torch import to end before the ready file
            spawned.discard()

    def place(self, mv: ModelVersion, slot_index: int, config: ModelConfig) -> Placement:
        """GPU round-robin (TorchServe's rule, from 0) with 1 thread (or its cpu_threads), or the
        worker's share of the host budget (threads, optional cores); the other CPU workers are
        re-tuned to it."""
        gpu_id = self.assigner.assign(mv.key, config.device_type, config.device_ids)
        if gpu_id is not None:  # a declared cpu_threads holds on a GPU too ("exactly this many")
            return Placement(gpu_id=gpu_id, threads=config.cpu_threads or GPU_WORKER_THREADS)
        versions = self.registry.all_versions() if self.registry is not None else [mv]
        share = self.budget.place(versions, mv, slot_index)
        return Placement(gpu_id=None, threads=share.threads, cpu_affinity=share.cpu_affinity)

    # -- lifecycle ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Thread-safe: ask a running server to shut down gracefully."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)

    async def serve(self) -> None:
        """Start, serve until a stop is asked, stop. In the main thread it owns SIGINT and
        SIGTERM (a stop; a second SIGINT: at once) until the process exits: ignored once the
        stop is done (``stop_signals.settle``)."""
        self._loop = asyncio.get_running_loop()
        self._loop.set_default_executor(JobThreads())  # the loop's close waits for no orphan
        self._stop = asyncio.Event()
        installed = stop_signals.install(self._on_signal)
        try:
            await self._start_unless_stopped(self._stop)
            await self._stop.wait()
        finally:
            try:
                await self.shutdown()
            finally:
                if installed:
                    stop_signals.settle()

    async def _start_unless_stopped(self, stop: asyncio.Event) -> None:
        """``startup``, cut short by a stop asked meanwhile (SIGTERM while the start-up models
        still load: they are not waited for); what started is then shut down as after a start.
        Raises what ``startup`` raised."""
        starting = asyncio.ensure_future(self.startup())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not starting.done():
                log.info("stop asked during start-up: the start-up models are not waited for")
                starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting

    def _on_signal(self, sig: int) -> None:
        if self._stop is not None:
            if self._stop.is_set() and sig == signal.SIGINT and not self._hurry.is_set():
                log.warning("second interrupt: stopping workers now")
                for _, server, _ in self._servers:
                    server.force_exit = True
                self._hurry.set()
            self._stop.set()

    async def startup(self) -> None:
        from torchbay.server.http.apps import build_apps

        config = self.config
        if not self._sockets:  # raises TorchbayError naming the file or listener; nothing written
            check_tls(config)
            self._sockets = bind_listeners(config)
        for name, sock in self._sockets.items():
            setattr(self.state.ports, name, sock.getsockname()[1])
        self.grpc = GrpcListeners(config)
        self.grpc.bind()  # TorchbayError naming the listener; nothing written yet
        self.state.ports.grpc_inference = self.grpc.ports["inference"]
        self.state.ports.grpc_management = self.grpc.ports["management"]
        if self.forks is not None:  # first: the start-up models' workers fork from it (one
            self.forks.start()  # torch import for them all, in parallel with what follows)
        self.plane = self._build_plane()
        apps = build_apps(config, self.plane)  # writes the key file: every listener is bound
        self.registry = apps.registry
        self.metrics = apps.metrics
        self.auth = apps.auth
        if self.auth is not None:
            log.info("token authorization on: keys in %s", self.auth.key_file)
        routes: dict[str, ASGIApp] = {
            "inference": apps.inference,
            "management": apps.management,
            "metrics": apps.metrics_app,
        }
        if "management" not in self._sockets:  # shares the inference address (KServe's config)
            routes["inference"] = CombinedApp(apps.inference, apps.management)
            del routes["management"]
            self.state.ports.management = self.state.ports.inference
        limits = HttpLimits.from_config(config, listeners=len(self._sockets))
        for name, app in routes.items():
            if name in self._sockets:  # no metrics listener with enable_metrics_api false
                # The inference listener refuses from the headers while a model refuses.
                early = apps.at_headers if name == "inference" else None
                await self._listen(name, app, protocol_class(limits, early))
        await self._start_grpc(apps)
        await self._load_startup_models()
        if apps.workflows is not None:  # load_workflows (server/workflows/startup.py)
            await load_startup_workflows(apps.workflows, self.state.failed_models)
        self.plane.starting = False  # ready (OIP, Kubernetes) once the start-up models are in
        self.plane.snapshots.save("startup")
        await asyncio.to_thread(self._discard_prewarmed)
        self.state.started.set()
        self._write_ready_file()
        log.info(
            "torchbay %s ready: inference :%d, management :%d, metrics :%d, "
            "gRPC inference :%d, gRPC management :%d",
            __version__,
            self.state.ports.inference,
            self.state.ports.management,
            self.state.ports.metrics,
            self.state.ports.grpc_inference,
            self.state.ports.grpc_management,
        )

    def _build_plane(self) -> Any:
        """The server's one data plane, not ready until ``_load_startup_models`` is done; its
        readiness counts the start-up failures (the same dict the ready file reports)."""
        plane = build_plane(
            self.config,
            place=self.place,
            budget=self.budget,
            server_version=__version__,
            env=self.env,
            prewarmed=self.take_prewarmed,
            spawn=self.forks.spawn if self.forks is not None else None,
            unplace=self.assigner.forget,
        )
        plane.startup_failures = self.state.failed_models
        plane.shm.cuda_devices = self.gpu_count  # CUDA shared memory needs a GPU (plane/shm.py)
        plane.registry.gpus = self.gpu_count
        plane.starting = True
        return plane

    async def _start_grpc(self, apps: Any) -> None:
        """The gRPC services over the same data plane and keys as the HTTP listeners."""
        assert self.grpc is not None
        calls = Calls(apps.plane, check_key=apps.auth.check if apps.auth is not None else None)
        await self.grpc.start(calls)

    async def _listen(self, name: str, app: ASGIApp, protocol: type) -> None:
        parsed = parse_address(getattr(self.config, f"{name}_address"))
        if parsed.host in ("0.0.0.0", "::") and self.config.disable_token_authorization:
            log.warning(
                "%s listener binds %s with token auth disabled: anyone who can reach this host "
                "can use it",
                name,
                parsed.host,
            )
        ssl = {}
        if parsed.tls:
            ssl = {
                "ssl_keyfile": str(self.config.private_key_file),
                "ssl_certfile": str(self.config.certificate_file),
            }
        uv_config = uvicorn.Config(
            app,
            lifespan="off",
            access_log=False,
            log_config=None,
            http=protocol,  # httptools plus header/body timeouts and header limits
            ws="none",
            loop="none",
            timeout_graceful_shutdown=self.config.shutdown_grace_s + WRITE_GRACE_S,
            timeout_keep_alive=self.config.keep_alive_timeout_s,  # type: ignore[arg-type]
            server_header=False,
            # No X-Forwarded-* rewriting: one less ASGI layer on every request. Put a proxy's
            # own access log in front if client addresses behind it matter.
            proxy_headers=False,
            **ssl,
        )
        uv_config.load()
        server = uvicorn.Server(uv_config)
        server.lifespan = uv_config.lifespan_class(uv_config)
        sock = self._sockets.pop(name)
        try:
            await server.startup(sockets=[sock])
        except BaseException:
            sock.close()
            raise
        self._servers.append((name, server, sock))

    async def _load_startup_models(self) -> None:
        assert self.registry is not None
        failed, late = self.state.failed_models, self._late_loads
        unloadable = self.plane.models.startup_unloadable  # of failed: its workers failed
        await load_startup_models(self.registry, self.config, failed, late, unloadable)

    def _write_ready_file(self) -> None:
        if self.ready_file is None:
            return
        ports = self.state.ports
        data = {
            "pid": os.getpid(),
            "inference": ports.inference,
            "management": ports.management,
            "metrics": ports.metrics,
            "grpc_inference": ports.grpc_inference,
            "grpc_management": ports.grpc_management,
            "failed_models": self.state.failed_models,
        }
        tmp = self.ready_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(data))
            tmp.replace(self.ready_file)
        except OSError as exc:  # the server stops: whoever waits on the file would never see it
            raise TorchbayError(
                f"cannot write the ready file {self.ready_file}: {exc.strerror or exc}"
            ) from None

    async def shutdown(self) -> None:
        log.info("shutting down: draining for up to %gs", self.config.shutdown_grace_s)
        close_all(self._sockets)  # bound but never served: a start that failed half-way
        if self.plane is not None and self.state.started.is_set():
            self.plane.snapshots.save("shutdown")  # what ran, before draining unloads it
        await asyncio.to_thread(self._discard_prewarmed)
        front = [s for s in self._servers if s[0] != "metrics"]
        back = [s for s in self._servers if s[0] == "metrics"]
        drain = (
            self.registry.drain(self.config.shutdown_grace_s, self._hurry)
            if self.registry is not None
            else asyncio.sleep(0)
        )
        grpc_stop = (
            self.grpc.stop(self.config.shutdown_grace_s)
            if self.grpc is not None
            else asyncio.sleep(0)
        )
        await asyncio.gather(
            drain, grpc_stop, *(server.shutdown(sockets=[sock]) for _, server, sock in front)
        )
        if self.registry is not None:
            await self.registry.stop(1.0 if self._hurry.is_set() else WORKERS_STOP_S)
        if self.forks is not None:
            await asyncio.to_thread(self.forks.close)
        for task in list(self._late_loads):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for _, server, sock in back:
            await server.shutdown(sockets=[sock])
        if self.metrics is not None and hasattr(self.metrics, "close"):
            self.metrics.close()
        if self.auth is not None:
            self.auth.delete_key_file()  # as TorchServe does; only if it is still ours
        if self.plane is not None:
            self.plane.close()
        log.debug("stopped")  # the one shutdown line is "shutting down" (uvicorn's are muted)
