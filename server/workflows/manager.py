"""The workflow management operations (register, list, describe, unregister), as TorchServe 0.12
answers them, for the management routes (``server/http/workflow_routes.py``) and start-up.

Registering a workflow unpacks its ``.war`` (``archive.py``), reads its DAG (``spec.py``) and
registers every node as a model named ``{workflow}__{node}``: a model node from its ``url``
(the model store, or an allowed URL) with the spec's workers, batch size and delay; a function
node from a folder made of the archive (``archive.function_folder``), whose worker calls the
handler's function, so that a user's function runs in a worker process, never in the frontend.
A node that fails to register fails the workflow (500, every failed node's reason named): the
nodes still loading stop then (``nodes.py``) and those registered are unregistered again.
Unregistering lets the workflow's runs in flight finish before its nodes go. Torch-free.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

from torchbay.server.errors import BadRequest, Conflict, TorchbayError
from torchbay.server.plane import DataPlane
from torchbay.server.plane.management import Management, Status, require_model_api
from torchbay.server.serving import store
from torchbay.server.serving.model import ModelVersion
from torchbay.server.workflows import archive
from torchbay.server.workflows.archive import WorkflowNotFound
from torchbay.server.workflows.nodes import NodeLoads
from torchbay.server.workflows.spec import parse_spec
from torchbay.server.workflows.workflow import Workflow

log = logging.getLogger("torchbay.workflows")


class ConflictStatusException(Conflict):
    pass


class BadRequestException(BadRequest):
    pass


class WorkflowException(TorchbayError):
    pass


class Workflows:
    """The registered workflows of one server, over its model management state."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane  # the node requests' exchanges (executor.py)
        self.management: Management = plane.management
        self.workflows: dict[str, Workflow] = {}
        # The names being registered or unregistered: taken (409) while their nodes load or
        # drain, which may take minutes; no lock is held meanwhile, so other workflows
        # register and go at once.
        self._taken: set[str] = set()
        # The model names of every workflow's nodes, each with its workflow, from its
        # registration's start to its unregistration's end: one name serves one workflow's
        # node at most (``a`` with node ``b__c`` and ``a__b`` with node ``c``: both a__b__c).
        self._claims: dict[str, Workflow] = {}

    def serves(self, mv: ModelVersion) -> bool:
        """Whether ``mv`` is a version a workflow's node registered (left out of config
        snapshots: TorchServe's snapshots hold no workflow). Only those: a model registered as
        ``{workflow}__other``, or another version of a node's model, is the operator's."""
        workflow = self._claims.get(mv.name)
        return workflow is not None and any(v is mv for v in workflow.versions.values())

    @property
    def store(self) -> Path | None:
        config = self.management.config
        return config.workflow_store or config.model_store

    def get(self, name: str) -> Workflow:
        workflow = self.workflows.get(name)
        if workflow is None:
            raise WorkflowNotFound(f"Workflow not found: {name}")
        return workflow

    # -- list, describe ---------------------------------------------------------------------------

    def list(self, limit: int | None, next_page_token: int | None) -> dict[str, Any]:
        """TorchServe's paging, as for models (plane.management.list_models)."""
        size = 100 if limit is None or not 0 <= limit <= 100 else limit
        token = 0 if next_page_token is None or next_page_token < 0 else next_page_token
        names = sorted(self.workflows)
        body: dict[str, Any] = {}
        if token + size <= len(names):
            body["nextPageToken"] = str(token + size)
        page = [self.workflows[n] for n in names[token : token + size]]
        body["workflows"] = [{"workflowName": w.name, "workflowUrl": w.url} for w in page]
        return body

    def describe(self, name: str) -> list[dict[str, Any]]:
        """TorchServe's describe: the spec's global settings and its DAG as Java prints it."""
        workflow = self.get(name)
        spec = workflow.spec.globals
        return [
            {
                "workflowName": name,
                "workflowUrl": workflow.url,
                "minWorkers": spec["min-workers"],
                "maxWorkers": spec["max-workers"],
                "batchSize": spec["batch-size"],
                "maxBatchDelay": spec["max-batch-delay"],
                "workflowDag": workflow.spec.dag_text,
            }
        ]

    # -- register, unregister ---------------------------------------------------------------------

    async def register(self, url: str | None, name: str | None, *, api: bool = True) -> Status:
        """Register the ``.war`` at ``url`` (``api``: through the management API, which needs the
        model API; start-up does not)."""
        if api:
            require_model_api(self.management)
        if not url:
            raise BadRequestException("Parameter url is required.")
        path = await self._locate(url)
        registry = self.management.registry
        folder = registry.workdir / f"workflow-{uuid.uuid4().hex[:12]}"
        try:
            unpacked = await asyncio.to_thread(
                archive.unpack, path, folder, self.management.config, name
            )
        finally:
            if url.startswith(("http://", "https://")):
                store.remove(path)
        try:
            workflow = Workflow(unpacked.name, url, parse_spec(unpacked.spec), folder)
            for node in workflow.spec.nodes:  # each becomes a model, and a folder, name
                store.check_name_and_version(workflow.model_of(node), "1.0")
            await self._register_workflow(workflow, unpacked)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        log.info("workflow %s registered: %d node(s)", workflow.name, len(workflow.spec.nodes))
        return Status(f"Workflow {workflow.name} has been registered and scaled successfully.")

    async def _register_workflow(self, workflow: Workflow, unpacked: archive.Unpacked) -> None:
        """Its nodes, its name taken meanwhile (no await between the check and the taking)."""
        if workflow.name in self.workflows or workflow.name in self._taken:
            raise ConflictStatusException(f"Workflow {workflow.name} is already registered.")
        names = {workflow.model_of(n) for n in workflow.spec.nodes}
        self._refuse_claimed(workflow, names)
        self._claims.update(dict.fromkeys(names, workflow))
        self._taken.add(workflow.name)
        try:
            await self._register_nodes(workflow, unpacked)
        except BaseException:
            self._release(workflow)
            raise
        finally:
            self._taken.discard(workflow.name)
        self.workflows[workflow.name] = workflow

    def _refuse_claimed(self, workflow: Workflow, names: set[str]) -> None:
        """A 500 in TorchServe's words, before any node loads, when another workflow's node
        has the model name of one of ``workflow``'s: its nodes would share that model (its
        runs answered by the other's node; its rollback or unregistration removing it)."""
        failures = [
            f"Workflow Node {name} failed to register. Details: Model {name} serves node "
            f"{name.removeprefix(owner.name + '__')} of workflow {owner.name}"
            for name in names
            if (owner := self._claims.get(name)) is not None
        ]
        if failures:
            raise WorkflowException(
                f"Workflow {workflow.name} has failed to register. "
                f"Failures: [{', '.join(sorted(failures))}]"
            )

    def _release(self, workflow: Workflow) -> None:
        for node in workflow.spec.nodes:
            if self._claims.get(workflow.model_of(node)) is workflow:
                del self._claims[workflow.model_of(node)]

    async def _locate(self, url: str) -> Path:
        if url.startswith(("http://", "https://")):
            fetch = self.management.registry.fetch
            if fetch is None:
                raise BadRequest("Registering from a URL is not enabled (allowed_urls)")
            return await fetch(url)
        return archive.war_path(self.store, url)

    async def _register_nodes(self, workflow: Workflow, unpacked: archive.Unpacked) -> None:
        """Every node (nodes.py: the first failure stops the others); a failure is a 500
        naming each failed node, once the nodes registered are unregistered again."""
        timeout = self.management.config.unregister_model_timeout_s
        loads = NodeLoads(self.management.registry, workflow, unpacked, timeout)
        failures = await loads.run()
        if failures:
            await self._unregister_nodes(workflow)
            raise WorkflowException(
                f"Workflow {workflow.name} has failed to register. "
                f"Failures: [{', '.join(failures)}]"
            )

    async def unregister(self, name: str, *, api: bool = True) -> Status:
        if api:
            require_model_api(self.management)
        workflow = self.get(name)
        del self.workflows[name]  # a new /wfpredict is a 404 from here
        self._taken.add(name)
        try:
            await self._finish_runs(workflow)
            await self._unregister_nodes(workflow)
        finally:
            self._release(workflow)
            self._taken.discard(name)
            shutil.rmtree(workflow.folder, ignore_errors=True)
        return Status(f'Workflow "{name}" unregistered')

    async def _finish_runs(self, workflow: Workflow) -> None:
        """The runs in flight go through every node before the nodes go, as a model's queued
        requests are answered before it goes (bounded by ``unregister_model_timeout_s``; those
        still running then fail at their next node)."""
        timeout = self.management.config.unregister_model_timeout_s
        try:
            await asyncio.wait_for(workflow.idle.wait(), timeout)
        except asyncio.TimeoutError:  # (not the builtin one on 3.10)
            log.warning(
                "workflow %s: %d run(s) still in flight after %g s; its nodes go now",
                workflow.name,
                workflow.runs,
                timeout,
            )

    async def _unregister_nodes(self, workflow: Workflow) -> None:
        """Exactly the model versions the workflow's nodes registered (TorchServe unregisters
        each node model's default version: one an operator added and made the default, and
        the node's own version then left behind, which made a registration again fail)."""
        registry = self.management.registry
        timeout = self.management.config.unregister_model_timeout_s
        versions = list(workflow.versions.values())
        workflow.versions.clear()
        results = await asyncio.gather(
            *(registry.remove(mv, timeout) for mv in versions), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                log.error("workflow %s: a node failed to unregister: %s", workflow.name, result)
