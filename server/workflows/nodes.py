"""A workflow's nodes registered side by side (``manager.py``), failing fast: once one node has
failed to register, the nodes still loading are stopped (each version removed as soon as it is
in the registry), so the workflow answers its 500 then, not once the slowest node's workers are
up, which may take minutes for a big model (TorchServe 0.12 waits for every node). Torch-free.
"""

from __future__ import annotations

import asyncio
import logging
import shutil

from torchbay.server.errors import TorchbayError
from torchbay.server.serving.model import ModelVersion
from torchbay.server.serving.registry import ModelRegistry
from torchbay.server.workflows import archive
from torchbay.server.workflows.spec import Node
from torchbay.server.workflows.workflow import Workflow

log = logging.getLogger("torchbay.workflows")


class NodeLoads:
    """One registration's nodes: each version is recorded in ``workflow.versions`` as soon as
    it is in the registry (the versions a rollback or an unregistration removes)."""

    def __init__(
        self,
        registry: ModelRegistry,
        workflow: Workflow,
        unpacked: archive.Unpacked,
        timeout: float,
    ) -> None:
        self.registry = registry
        self.workflow = workflow
        self.unpacked = unpacked
        self.timeout = timeout  # unregister_model_timeout_s, for the versions stopped
        self.failed = False  # a node failed: every other one stops
        self.stops: dict[str, asyncio.Future[None]] = {}  # node -> its version's removal

    async def run(self) -> list[str]:
        """Register every node; the failures in TorchServe's words (none: all registered),
        once the nodes stopped for them are gone. A node stopped here is no failure."""
        nodes = self.workflow.spec.nodes
        tasks = {asyncio.ensure_future(self._register(node)): name for name, node in nodes.items()}
        errors: dict[str, BaseException] = {}
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    error = task.exception()
                    if error is not None and tasks[task] not in self.stops:
                        errors[tasks[task]] = error
                if errors and not self.failed:
                    self.failed = True
                    for node, mv in self.workflow.versions.items():
                        self._stop(node, mv)
            await asyncio.gather(*self.stops.values(), return_exceptions=True)
        except BaseException:  # cancelled: the server stops
            for task in tasks:
                task.cancel()
            raise
        return [
            f"Workflow Node {self.workflow.model_of(name)} failed to register. Details: "
            + (error.message if isinstance(error, TorchbayError) else "Check error logs.")
            for name in nodes
            if (error := errors.get(name)) is not None
        ]

    def _registered(self, node: str, mv: ModelVersion) -> None:
        self.workflow.versions[node] = mv
        if self.failed:  # registered after another node failed: it goes before it loads
            self._stop(node, mv)

    def _stop(self, node: str, mv: ModelVersion) -> None:
        if node not in self.stops:
            self.stops[node] = asyncio.ensure_future(self.registry.remove(mv, self.timeout))

    async def _register(self, node: Node) -> None:
        name = self.workflow.model_of(node.name)
        overrides = {
            "min_worker": node.settings["min-workers"],
            "max_worker": node.settings["max-workers"],
            "batch_size": node.settings["batch-size"],
            "max_batch_delay": node.settings["max-batch-delay"],
        }
        registered = lambda mv: self._registered(node.name, mv)  # noqa: E731
        try:
            if node.url is not None:
                await self.registry.register(
                    node.url, name=name, overrides=overrides, startup=False, registered=registered
                )
                return
            folder = self.workflow.folder
            dest = folder.parent / f"{folder.name}-{node.name}"
            folder = await asyncio.to_thread(
                archive.function_folder, self.unpacked, node.name, name, dest
            )
            try:
                await self.registry.register_local(
                    folder, name=name, overrides=overrides, registered=registered
                )
            finally:
                shutil.rmtree(folder, ignore_errors=True)  # the registry copied it
        except Exception as exc:
            if node.name not in self.stops:
                log.error(
                    "workflow %s: node %s failed to register: %s", self.workflow.name, name, exc
                )
            raise
