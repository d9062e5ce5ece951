"""The workflows registered at start-up (``load_workflows`` / ``--workflows``: ``all``, ``x.war``
or ``name=x.war``), after the start-up models. TorchServe 0.12 registers workflows through the
management API only; torchbay also takes them at start, as ``load_models`` takes models. A
workflow that fails is logged and reported like a start-up model (the ready file, readiness);
it never stops the others. Torch-free.
"""

from __future__ import annotations

import asyncio
import logging

from torchbay.server.workflows.manager import Workflows

log = logging.getLogger("torchbay.workflows")


def startup_workflows(workflows: Workflows) -> list[tuple[str, str | None]]:
    """(url, name or None) of every workflow asked for at start, each once."""
    jobs: list[tuple[str, str | None]] = []
    for entry in workflows.management.config.load_workflows:
        if entry.strip().lower() == "all":
            store = workflows.store
            if store is not None and store.is_dir():
                jobs += [(p.name, None) for p in sorted(store.glob("*.war")) if p.is_file()]
            continue
        name, sep, url = entry.strip().partition("=")
        jobs.append((url.strip(), name.strip() or None) if sep else (name, None))
    return list(dict.fromkeys(jobs))


async def load_startup_workflows(workflows: Workflows, failed: dict[str, str]) -> None:
    """Register them side by side; a failure goes into ``failed`` by its label."""

    async def load(url: str, name: str | None) -> None:
        label = f"workflow {name or url}"
        try:
            await workflows.register(url, name, api=False)
        except Exception as exc:  # one bad workflow never stops the others
            failed[label] = str(getattr(exc, "message", exc))
            log.error("%s failed to register: %s", label, failed[label])

    await asyncio.gather(*(load(url, name) for url, name in startup_workflows(workflows)))
