"""A test handler that leaves things behind, as handler authors do. Each request is a JSON
object; keys:

  {"thread": true}       start a non-daemon thread that sleeps 600 s (never joined)
  {"mp_child": path}     start a non-daemon ``multiprocessing`` child (fork) that sleeps 600 s
                         and write its pid to ``path``: multiprocessing's exit hook joins it
  {"close_channel": true} close every socket the worker holds (its channel to the frontend)
Every answer is {"pid": the worker's pid}.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from torchbay.handlers.base_handler import BaseHandler


def _close_sockets() -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except OSError:  # the listing's own descriptor, gone already
            continue


class LeftoverHandler(BaseHandler):
    def handle(self, data: list[Any], context: Any) -> list[Any]:
        for row in data:
            body = row.get("body") if isinstance(row, dict) else None
            body = body if isinstance(body, dict) else {}
            if body.get("thread"):
                threading.Thread(target=time.sleep, args=(600,), name="leftover").start()
            if "mp_child" in body:
                child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
                child.start()
                Path(body["mp_child"]).write_text(str(child.pid))
            if body.get("close_channel"):
                _close_sockets()
        return [{"pid": os.getpid()} for _ in data]
