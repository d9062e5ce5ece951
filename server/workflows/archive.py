"""The workflow store's side of a workflow: where a URL points in it, the ``.war`` unpacked with
the model archives' safety checks (``archiver/war.py``), its manifest checked as TorchServe checks
it, its spec read (``yaml.safe_load`` only), and the folder each function node is served from.
Torch-free.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from torchbay.server.config.settings import ServerConfig
from torchbay.server.errors import BadRequest, NotFound
from torchbay.server.serving.archives import WAR_MANIFEST, ArchiveError, extract_war, safe_relpath

# The values a spec may hold once its YAML aliases are expanded (an alias counts as all it
# names): a 1 KB spec of nested aliases (a "billion laughs") expands past any memory when it is
# read, and blocked the server for as long. TorchServe's reader (SnakeYAML) refuses it too.
MAX_SPEC_VALUES = 100_000


class WorkflowNotFound(NotFound):
    type = "WorkflowNotFoundException"


class InvalidWorkflow(BadRequest):
    type = "InvalidWorkflowException"


def war_path(store: Path | None, url: str) -> Path:
    """The ``.war`` that ``url`` names in the workflow store; TorchServe's 404s otherwise."""
    if store is None:
        raise WorkflowNotFound("Workflow store has not been configured.")
    if ".." in url:
        raise WorkflowNotFound(f"Relative path is not allowed in url: {url[:256]}")
    name = url.removeprefix("file://")
    if any(ord(c) < 0x20 for c in name) or name.startswith("/") or "\\" in name:
        raise WorkflowNotFound(f"Workflow not found in workflow store: {url[:256]}")
    try:
        candidate = (store / name).resolve()
        inside = store.resolve() in candidate.parents
        found = inside and candidate.is_file()
    except OSError:  # a name too long for the file system, ...
        found = False
    if not found:
        raise WorkflowNotFound(f"Workflow not found in workflow store: {url[:256]}")
    return candidate


@dataclass(frozen=True)
class Unpacked:
    """A ``.war`` unpacked in the server's work folder."""

    folder: Path
    name: str  # the manifest's workflowName, or the registration's workflow_name
    spec: dict[str, Any]
    handler: str | None  # the handler file's path inside ``folder``


def unpack(path: Path, folder: Path, config: ServerConfig, name: str | None) -> Unpacked:
    """Unpack and check; the folder is removed again when anything is refused (400)."""
    try:
        manifest = extract_war(
            path,
            folder,
            max_total_bytes=config.max_archive_expanded_size,
            max_ratio=config.max_archive_compression_ratio,
        )
        return _checked(folder, manifest, name)
    except ArchiveError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise InvalidWorkflow(str(exc)) from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _checked(folder: Path, manifest: dict[str, Any], name: str | None) -> Unpacked:
    """TorchServe's manifest checks (WorkflowArchive.validate), then the spec file."""
    workflow = manifest.get("workflow")
    if not isinstance(workflow, dict):
        raise InvalidWorkflow("Missing Workflow entry in manifest file.")
    name = name or workflow.get("workflowName")
    if not isinstance(name, str) or not name:
        raise InvalidWorkflow("Workflow name is not defined.")
    if manifest.get("archiverVersion") is None:
        raise InvalidWorkflow("Workflow archive version is not defined.")
    if manifest.get("createdOn") is None:
        raise InvalidWorkflow("Workflow archive createdOn is not defined.")
    spec_file = _member(folder, workflow.get("specFile"), "spec file")
    if spec_file is None:
        raise InvalidWorkflow("The workflow archive names no spec file.")
    try:
        spec = yaml.safe_load(spec_file.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError):  # (nested too deep)
        raise InvalidWorkflow("Failed to parse yaml.") from None
    if not _expands_within(spec, MAX_SPEC_VALUES):
        raise InvalidWorkflow(
            f"Failed to parse yaml: it holds more than {MAX_SPEC_VALUES} values once its "
            "aliases are expanded."
        )
    handler = _member(folder, workflow.get("handler"), "handler")
    return Unpacked(folder, name, spec, handler.name if handler is not None else None)


def _expands_within(data: Any, limit: int) -> bool:
    """Whether ``data`` (a loaded YAML document) holds at most ``limit`` values, each alias
    counted as what it names (a document that holds itself never is); at most ``limit`` steps."""
    stack = [data]
    while stack:
        limit -= 1
        if limit < 0:
            return False
        item = stack.pop()
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    return True


def _member(folder: Path, name: Any, what: str) -> Path | None:
    if name is None or name == "":
        return None
    if not isinstance(name, str) or safe_relpath(name) or name.startswith(WAR_MANIFEST):
        raise InvalidWorkflow(f"The workflow archive's {what} is not a file inside it.")
    path = folder / name
    if not path.is_file():
        raise InvalidWorkflow(f"The workflow archive's {what} {name} is missing.")
    return path


def function_folder(unpacked: Unpacked, node: str, model_name: str, dest: Path) -> Path:
    """A model folder serving ``node``, a function of the workflow's handler file: the
    ``.war``'s files and a manifest whose handler is ``<handler file>:<node>`` (how TorchServe
    registers a function node). Its worker loads it like any model, outside the frontend."""
    if unpacked.handler is None:
        raise InvalidWorkflow(
            f"Node {node} is no model of the spec and the archive has no handler."
        )
    shutil.copytree(unpacked.folder, dest, ignore=shutil.ignore_patterns("WAR-INF"))
    manifest = {
        "createdOn": "",
        "runtime": "python",
        "model": {
            "modelName": model_name,
            "modelVersion": "1.0",
            "handler": f"{unpacked.handler}:{node}",
        },
        "archiverVersion": "torchbay-workflow",
    }
    (dest / "MAR-INF").mkdir()
    (dest / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    return dest
