"""One registered workflow (``manager.py`` registers it): its DAG, the model version each node
registered, and its runs in flight. Torch-free."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from torchbay.server.serving.model import ModelVersion
from torchbay.server.workflows.spec import WorkflowSpec


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


@dataclass
class Workflow:
    """A registered workflow: its DAG, the model each node is served by, and its runs in flight
    (``/wfpredict`` requests), which its unregistration lets finish."""

    name: str
    url: str
    spec: WorkflowSpec
    folder: Path
    # The model version each node registered, by node: the one its unregistration removes,
    # whatever other versions of that model an operator registered or made the default.
    versions: dict[str, ModelVersion] = field(default_factory=dict)
    runs: int = 0
    idle: asyncio.Event = field(default_factory=_set_event)  # set while no run is in flight

    def model_of(self, node: str) -> str:
        return f"{self.name}__{node}"

    @contextmanager
    def running(self) -> Iterator[None]:
        """One run of the DAG, counted from the end of its request's body (http/wfpredict.py)
        until it ends however it ends."""
        self.runs += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.runs -= 1
            if not self.runs:
                self.idle.set()
