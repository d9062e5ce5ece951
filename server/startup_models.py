"""The start-up models (``load_models``, ``models={...}``): registered concurrently while the
server starts (``serve.TorchbayServer.startup``). A model that fails is reported with its reason
(``failed``, which the ready file and readiness read) and the others keep loading; one past
``workers_start_timeout_s`` is reported and goes on loading (``late``). A start cut short (a stop
asked during start-up) cancels every load still under way."""

from __future__ import annotations

import asyncio
import logging

from torchbay.server.config.settings import ServerConfig
from torchbay.server.serving.handle import WorkerLoadError
from torchbay.server.serving.registry import ModelRegistry

log = logging.getLogger("torchbay.serve")


def startup_jobs(registry: ModelRegistry, config: ServerConfig) -> list[tuple[str, str | None]]:
    """(url, name or None) of each start-up model, once each."""
    # An archive that a models={...} entry names by marName loads under that entry's name,
    # once, however else it is listed (load_models=x.mar, load_models=all).
    by_mar = {
        mc.mar_name: name
        for name, versions in config.models.items()
        for mc in versions.values()
        if mc.mar_name
    }
    jobs: list[tuple[str, str | None]] = []
    if config.load_all:
        jobs += [(path.name, by_mar.get(path.name)) for path in registry.store_archives()]
    jobs += [(spec.url, spec.name or by_mar.get(spec.url)) for spec in config.model_specs()]
    named = {name for _, name in jobs if name}
    # models={...} entries with a marName load too, every version of them (a snapshot's
    # versions side by side, as TorchServe restores them), unless load_models named the model.
    for model_name, versions in config.models.items():
        if model_name in named:
            continue
        jobs += [(mc.mar_name, model_name) for mc in versions.values() if mc.mar_name]
    return list(dict.fromkeys(jobs))


async def load_startup_models(
    registry: ModelRegistry,
    config: ServerConfig,
    failed: dict[str, str],
    late: set[asyncio.Future[None]],
    unloadable: set[str] | None = None,
) -> None:
    """Register every start-up model; return once all did or ``workers_start_timeout_s``
    passed (those still loading are in ``late``). The label of one whose workers could not
    load its model (not a refused archive) goes in ``unloadable`` too."""
    jobs = startup_jobs(registry, config)
    if not jobs:
        return

    async def load(url: str, name: str | None) -> None:
        label = name or url
        try:
            await registry.register(url, name=name)
        except Exception as exc:  # one bad model never stops the others
            failed[label] = str(exc)
            if isinstance(exc, WorkerLoadError) and unloadable is not None:
                unloadable.add(label)
            log.error("model %s failed to load: %s", label, exc)
        else:
            failed.pop(label, None)  # reported late, loaded at last

    tasks = {asyncio.ensure_future(load(url, name)): name or url for url, name in jobs}
    try:
        _, still = await asyncio.wait(tasks, timeout=config.workers_start_timeout_s)
    except asyncio.CancelledError:  # stopped during start-up: no load goes on
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    for task in still:  # reported failed; it goes on loading and serves once it is ready
        label = tasks[task]
        failed[label] = (
            f"not loaded within workers_start_timeout_s ({config.workers_start_timeout_s:g}s)"
        )
        log.error("model %s did not load within workers_start_timeout_s", label)
        late.add(task)
        task.add_done_callback(late.discard)
