"""A workflow in one archive: the models of ``workflow.yaml``, chained, in one worker.

TorchServe serves workflows from a ``.war`` whose ``workflow.yaml`` names models and a DAG; each
node's output is the next node's input. This handler reads the same ``workflow.yaml`` (``models``:
``name: {url: x.mar}``; ``dag``: ``a: [b]``), limited to a chain (each node feeds at most one
other), from its own archive: the node archives travel inside it as extra files. ``initialize``
unpacks each with the server's safety checks and loads it with ``load_service``, the worker's own
loader; ``handle`` runs the batch through the nodes in order with ``Service.predict``. So each
node decodes, batches, fails and answers exactly as when it is served alone, and a request a
node refuses gets that node's status and error body, naming the node (the rest go on).
"""

import json
from pathlib import Path

import yaml

from torchbay.archiver.extract import extract_archive
from torchbay.handlers.errors import HandlerLoadError
from torchbay.handlers.runtime.service import Request, load_service


def chain(dag: dict) -> list[str]:
    """The node order of a chain-shaped DAG ``{a: [b], b: [c]}``; anything else is refused."""
    edges = {str(k): [str(v) for v in (vs or [])] for k, vs in dag.items()}
    if any(len(vs) > 1 for vs in edges.values()):
        raise HandlerLoadError("workflow.yaml: only chains are supported (one successor each)")
    targets = {v for vs in edges.values() for v in vs}
    starts = [node for node in edges if node not in targets]
    if len(starts) != 1:
        raise HandlerLoadError(f"workflow.yaml: the dag needs exactly one start, got {starts}")
    order = [starts[0]]
    while edges.get(order[-1]):
        order.append(edges[order[-1]][0])
        if order[-1] in order[:-1]:
            raise HandlerLoadError("workflow.yaml: the dag has a cycle")
    return order


class WorkflowHandler:
    def initialize(self, context):
        props = context.system_properties
        model_dir = Path(props["model_dir"])
        spec = yaml.safe_load((model_dir / "workflow.yaml").read_text(encoding="utf-8"))
        models = {k: v for k, v in spec["models"].items() if isinstance(v, dict)}
        self.order = chain(spec["dag"])
        self.nodes = {}
        for name in self.order:
            if name not in models:
                raise HandlerLoadError(f"workflow.yaml: dag node {name!r} is not a model")
            folder = model_dir / "_nodes" / name
            extract_archive(model_dir / models[name]["url"], folder)
            self.nodes[name] = load_service(
                folder, batch_size=props["batch_size"], gpu_id=props["gpu_id"], model_name=name
            )

    def handle(self, data, context):
        # The first node gets each request as it came in: its body and content type.
        current = {}
        for i, row in enumerate(data):
            body = row.get("body")
            ctype = context.get_request_header(i, "content-type") or ""
            if not isinstance(body, (bytes, bytearray)):  # the frontend decoded JSON/text
                body = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            current[i] = Request(str(i), bytes(body), ctype, {"content-type": ctype})
        results = [None] * len(data)
        for step, name in enumerate(self.order):
            indices = list(current)
            outcome = self.nodes[name].predict([current[i] for i in indices])
            for i, response in zip(indices, outcome.responses, strict=True):
                last = step == len(self.order) - 1
                if response.status >= 400 or last:
                    del current[i]
                    results[i] = self._answer(context, i, name, response)
                else:  # this node's answer is the next node's request
                    ctype = response.content_type
                    current[i] = Request(str(i), response.body, ctype, {"content-type": ctype})
        return results

    def _answer(self, context, i, node, response):
        context.set_response_status(response.status, idx=i)
        context.set_response_header(i, "X-Workflow-Node", node)
        if response.status >= 400:
            error = json.loads(response.body)
            return {**error, "message": f"{node}: {error.get('message', '')}"}
        context.set_response_content_type(i, response.content_type)
        return response.body
