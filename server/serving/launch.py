"""What a worker is launched with, written down once.

``ModelSettings`` are a model version's live-tunable settings (resolved once from every source by
the registry; live changes make a new frozen copy). ``LaunchSpec`` is everything that starts one
worker: the model, the handler, the device and threads, the environment and the log format. The
``Load`` message and the spawn arguments both come from it (:meth:`LaunchSpec.load_message`,
:meth:`LaunchSpec.new_worker`), so no launch fact is copied anywhere else. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torchbay.server.config.settings import RESTART_BACKOFF_S, ModelConfig, ServerConfig
from torchbay.server.serving import protocol as p
from torchbay.server.serving.handle import SpawnFn, WorkerProcess


@dataclass(frozen=True)
class ModelSettings:
    """The live-tunable settings of one model version (already resolved from every source)."""

    batch_size: int = 1
    max_batch_delay_ms: float = 100.0
    response_timeout_s: float = 120.0
    startup_timeout_s: float = 120.0
    job_queue_size: int = 100
    client_timeout_ms: float = 0.0
    max_retry_timeout_s: float = 300.0
    min_workers: int = 1
    max_workers: int = 1
    restart_backoff_s: tuple[float, ...] = RESTART_BACKOFF_S  # the server's, by failure count
    max_requests_per_worker: int = 0  # recycle a worker after this many requests (0: never)
    max_worker_rss_mb: int = 0  # recycle a worker past this resident memory (0: never)
    max_response_size: int = 0  # bytes of one response body (0: no limit)
    max_queue_delay_ms: float = 0.0  # admission bound on a request's queue time (0: off)
    sla_p99_ms: float | None = None  # the autopilot's latency target (None: off)

    def updated(self, **changes: Any) -> ModelSettings:
        """A copy with the given (non-None) changes."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def settings_from(config: ModelConfig, server: ServerConfig | None = None) -> ModelSettings:
    """A model's live settings; the server-wide ones (restart back-off, response limit) from
    ``server`` when given."""
    extra: dict[str, Any] = {}
    if server is not None:
        extra = {
            "restart_backoff_s": server.restart_backoff_s,
            "max_response_size": server.max_response_size,
        }
    return ModelSettings(
        batch_size=config.batch_size,
        max_batch_delay_ms=config.max_batch_delay_ms,
        response_timeout_s=config.response_timeout_s,
        startup_timeout_s=config.startup_timeout_s,
        job_queue_size=config.job_queue_size,
        client_timeout_ms=config.client_timeout_ms,
        max_retry_timeout_s=config.max_retry_timeout_s,
        min_workers=config.min_workers,
        max_workers=config.max_workers if config.max_workers is not None else config.min_workers,
        max_requests_per_worker=config.max_requests_per_worker,
        max_worker_rss_mb=config.max_worker_rss_mb,
        max_queue_delay_ms=config.max_queue_delay_ms,
        sla_p99_ms=config.sla_p99_ms,
        **extra,
    )


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one worker runs: a GPU id (None = CPU), its torch threads, optional core affinity."""

    gpu_id: int | None
    threads: int
    cpu_affinity: tuple[int, ...] | None = None


@dataclass(frozen=True)
class LaunchSpec:
    """Everything one worker starts with. A model version holds one (its placement and batch
    size left at their defaults); each slot derives its own with :meth:`placed`."""

    model_dir: Path
    model_name: str
    model_version: str
    handler: str | None = None  # overrides the manifest's handler (management API)
    server_version: str = ""
    limit_max_image_pixels: bool = True
    max_request_size: int = 6553500  # the worker's cap on a decompressed request body
    env: Mapping[str, str] | None = None  # None: the server's own environment
    log_format: str = "text"
    batch_size: int = 1
    placement: Placement = Placement(gpu_id=None, threads=1)

    def placed(self, placement: Placement, batch_size: int) -> LaunchSpec:
        return replace(self, placement=placement, batch_size=batch_size)

    def load_message(self) -> p.Load:
        where = self.placement
        return p.Load(
            model_dir=str(self.model_dir),
            model_name=self.model_name,
            model_version=self.model_version,
            batch_size=self.batch_size,
            gpu_id=where.gpu_id,
            handler=self.handler,
            num_threads=where.threads,
            cpu_affinity=list(where.cpu_affinity) if where.cpu_affinity else None,
            server_version=self.server_version,
            limit_max_image_pixels=self.limit_max_image_pixels,
            max_request_size=self.max_request_size,
        )

    def new_worker(self, spawn: SpawnFn | None = None) -> WorkerProcess:
        return WorkerProcess(
            self.load_message(), env=self.env, log_format=self.log_format, spawn=spawn
        )
