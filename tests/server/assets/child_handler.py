"""A test handler that starts a child process, as handlers do (a tokenizer or decoder server,
ffmpeg, DataLoader workers), and does not clean it up.

A request is a JSON object ``{"note": path, "then": what}``: the handler starts ``sleep 600``,
writes its pid to ``path``, then, by ``then``: "hang" (sleeps past any response timeout),
"exit" (``os._exit(7)``, a crash), anything else answers ``{"pid": the worker's pid}``.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from torchbay.handlers.base_handler import BaseHandler


class ChildHandler(BaseHandler):
    def handle(self, data: list[Any], context: Any) -> list[Any]:
        for row in data:
            body = row.get("body") if isinstance(row, dict) else None
            if not isinstance(body, dict) or "note" not in body:
                continue
            child = subprocess.Popen(["sleep", "600"])
            Path(body["note"]).write_text(str(child.pid))
            if body.get("then") == "hang":
                time.sleep(600)
            if body.get("then") == "exit":
                os._exit(7)
        return [{"pid": os.getpid()} for _ in data]
