"""A test handler that sets per-thread state in ``initialize``, as handler authors do, and
relies on it in ``handle``: torch's grad mode off (``torch.set_grad_enabled(False)``, so that
outputs convert with ``.numpy()``), and a SIGALRM handler for a signal-based time limit (as the
``timeout-decorator`` package does; Python installs signal handlers on the main thread only).
Every answer says what ``handle`` saw: {"grad": bool, "main_thread": bool, "numpy": [...]}.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import torch

from torchbay.handlers.base_handler import BaseHandler


def _too_slow(signum: int, frame: Any) -> None:
    raise TimeoutError("inference took too long")


class ThreadStateHandler(BaseHandler):
    def initialize(self, context: Any) -> None:
        super().initialize(context)
        torch.set_grad_enabled(False)

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        signal.signal(signal.SIGALRM, _too_slow)
        signal.alarm(30)
        try:
            weights = torch.ones(2, requires_grad=True)
            out = (weights * 2).numpy().tolist()  # raises where grad mode is on
        finally:
            signal.alarm(0)
        seen = {
            "grad": torch.is_grad_enabled(),
            "main_thread": threading.current_thread() is threading.main_thread(),
            "numpy": out,
        }
        return [seen for _ in data]
