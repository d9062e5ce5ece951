"""A workflow's specification (the ``.war``'s YAML) read as TorchServe 0.12 reads it, and its DAG.

``models`` holds the global node settings (``min-workers``, ``max-workers``, ``batch-size``,
``max-batch-delay``, ``retry-attempts``, ``timeout-ms``) and one entry per model (its ``url``
and its own overrides); like TorchServe, a global applies to the models listed after it. ``dag``
maps each node to its children. A node named in the DAG is a model node when ``models`` has it,
else a function node: a function of the workflow's handler file, served with one worker, batch
size 1 and no batch delay. Model entries the DAG never names are not served.

A ``timeout-ms`` of 0 or below is refused (400): TorchServe 0.12 registers such a workflow and
fails every node of every request at once (``tests/data/torchserve/workflow_timeout``).

A node's workers, batch size and delay are its model's settings: TorchServe registers any
number, torchbay reads one below the setting's bound (a batch size of 0, -1 workers) as the
spec's default, as its model API reads such a parameter, and refuses one past the bound (400).

The DAG must have exactly one start node and no cycle; the messages are TorchServe's. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchbay.server.config.model_settings import API_NAMES, SETTINGS, check_model_settings
from torchbay.server.errors import BadRequest

# TorchServe's defaults (ensemble/WorkFlow.java), by spec key.
DEFAULTS = {
    "min-workers": 1,
    "max-workers": 1,
    "batch-size": 1,
    "max-batch-delay": 50,
    "retry-attempts": 1,
    "timeout-ms": 10000,
}
# The settings a model node is registered with: spec key -> management API name (its bounds).
REGISTERED = {
    "min-workers": "min_worker",
    "max-workers": "max_worker",
    "batch-size": "batch_size",
    "max-batch-delay": "max_batch_delay",
}
# A function node's own settings (TorchServe registers it with these, whatever the globals say).
FUNCTION_SETTINGS = {"min-workers": 1, "max-workers": 1, "batch-size": 1, "max-batch-delay": 0}


class InvalidDag(BadRequest):
    """TorchServe's InvalidDAGException: answered 400."""

    type = "InvalidDAGException"


@dataclass(frozen=True)
class Node:
    """One DAG node: a model (``url`` set) or a function of the handler file."""

    name: str
    url: str | None
    settings: dict[str, int]

    @property
    def is_function(self) -> bool:
        return self.url is None


@dataclass
class WorkflowSpec:
    nodes: dict[str, Node]  # in the order the DAG names them
    children: dict[str, list[str]]
    parents: dict[str, list[str]] = field(default_factory=dict)
    globals: dict[str, int] = field(default_factory=dict)
    dag_text: str = ""  # describe's workflowDag: the dag mapping as TorchServe prints it

    @property
    def start(self) -> str:
        return next(name for name in self.nodes if not self.parents[name])

    def leaves(self) -> list[str]:
        return [name for name in self.nodes if not self.children[name]]


def _int(key: str, value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"Invalid workflow specification: {where} {key} must be an integer")
    if key == "timeout-ms" and value <= 0:
        # TorchServe 0.12 registers it and then fails every node at once (a wait of 0 ms).
        raise BadRequest(
            f"Invalid workflow specification: {where} timeout-ms must be above 0, got {value}"
        )
    return value


def _models(section: Any) -> tuple[dict[str, int], dict[str, Node]]:
    """The globals as they stand at the end, and each model node with the globals before it."""
    if not isinstance(section, dict):
        raise BadRequest("Invalid workflow specification: 'models' must be a mapping")
    current = dict(DEFAULTS)
    models: dict[str, Node] = {}
    for key, value in section.items():
        key = str(key)
        if key in DEFAULTS:
            current[key] = _int(key, value, "models")
            continue
        if not isinstance(value, dict) or not isinstance(value.get("url"), str):
            raise BadRequest(f"Invalid workflow specification: model {key!r} needs a url")
        own = {k: _int(k, value[k], f"model {key!r}") for k in DEFAULTS if k in value}
        models[key] = Node(key, value["url"], _registered({**current, **own}, key))
    return current, models


def _registered(settings: dict[str, int], model: str) -> dict[str, int]:
    """A model node's settings as its model takes them: below the bound, the spec's default;
    fewer max than min workers, the min; past a bound, a 400 naming the model and the key."""
    out = dict(settings)
    for key, api in REGISTERED.items():
        setting = SETTINGS[API_NAMES[api]]
        lower = setting.lower if setting.lower is not None else out[key]
        if out[key] < lower or (setting.lower_open and out[key] == lower):
            out[key] = DEFAULTS[key]
    out["max-workers"] = max(out["max-workers"], out["min-workers"])
    try:
        check_model_settings({api: out[key] for key, api in REGISTERED.items()})
    except BadRequest as exc:
        message = f"Invalid workflow specification: model {model!r}: {exc.message}"
        raise BadRequest(message) from None
    return out


def parse_spec(data: Any) -> WorkflowSpec:
    """The spec from its YAML (already ``safe_load``-ed); raises BadRequest / InvalidDag."""
    if not isinstance(data, dict):
        raise BadRequest("Invalid workflow specification: the spec file must be a YAML mapping")
    globals_, models = _models(data.get("models") or {})
    dag = data.get("dag")
    if not isinstance(dag, dict) or not dag:
        raise BadRequest("Invalid workflow specification: 'dag' must be a non-empty mapping")
    function = {
        **FUNCTION_SETTINGS,
        "retry-attempts": globals_["retry-attempts"],
        "timeout-ms": globals_["timeout-ms"],
    }
    spec = WorkflowSpec({}, {}, {}, globals_, _dag_text(dag))

    def add(name: str) -> None:
        if name not in spec.nodes:
            spec.nodes[name] = models.get(name) or Node(name, None, dict(function))
            spec.children[name], spec.parents[name] = [], []

    for parent, kids in dag.items():
        parent = str(parent)
        add(parent)
        if kids is not None and not isinstance(kids, list):
            raise BadRequest(f"Invalid workflow specification: dag {parent!r} must map to a list")
        for kid in kids or []:
            if kid is None or not str(kid).strip():
                continue
            _edge(spec, parent, str(kid), add)
    validate(spec)
    return spec


def _edge(spec: WorkflowSpec, parent: str, kid: str, add: Any) -> None:
    add(kid)
    if parent == kid:
        raise InvalidDag("Self loop exception")
    if kid in spec.children[parent]:
        # TorchServe's Dag.addEdge calls a repeated edge (``a: [b, b]``) a loop; a real cycle
        # is found by ``validate``.
        raise InvalidDag("loop exception")
    spec.children[parent].append(kid)
    spec.parents[kid].append(parent)


def validate(spec: WorkflowSpec) -> list[str]:
    """One start node, and a topological order that reaches every node (no cycle)."""
    starts = [name for name in spec.nodes if not spec.parents[name]]
    if len(starts) != 1:
        raise InvalidDag("DAG should have only one start node")
    waiting = {name: len(spec.parents[name]) for name in spec.nodes}
    order, ready = [], list(starts)
    while ready:
        name = ready.pop()
        order.append(name)
        for kid in spec.children[name]:
            waiting[kid] -= 1
            if waiting[kid] == 0:
                ready.append(kid)
    if len(order) != len(spec.nodes):
        raise InvalidDag("Not a valid DAG")
    return order


def _dag_text(dag: dict[Any, Any]) -> str:
    """A mapping as Java's ``LinkedHashMap.toString`` prints it (describe's ``workflowDag``)."""
    items = ", ".join(f"{k}=[{', '.join(str(v) for v in (vs or []))}]" for k, vs in dag.items())
    return "{" + items + "}"
