"""The client's side of gate_handler.py's gate, shared by the scenarios that hold its worker busy
(busy.py, ../answers/scenario.py): the scenario's HTTP client, the body of a held request and a
bounded wait. Standard library only (the recorders run the scenarios in TorchServe's virtualenv);
each scenario puts this folder on ``sys.path`` (tests/data is no package)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# ``call(method, url, body)``: (status, body as JSON or text) for any status.
Call = Callable[[str, str, "bytes | None"], tuple[int, Any]]
WAIT_S = 60.0


def until(condition: Callable[[], bool], timeout: float = WAIT_S) -> bool:
    """Poll ``condition`` every 50 ms until it holds (True) or ``timeout`` seconds pass (False)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def hold(started: Path, gate: Path) -> bytes:
    """A request's body that gate_handler.py holds: it creates ``started`` when its batch begins,
    then waits until ``gate`` exists."""
    return json.dumps({"started": str(started), "gate": str(gate)}).encode()
