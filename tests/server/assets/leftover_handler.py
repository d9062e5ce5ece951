"""A test handler that leaves things behind, or writes where it should not, as handler authors
do. Each request is a JSON object; keys:

  {"thread": true}       start a non-daemon thread that sleeps 600 s (never joined)
  {"mp_child": path}     start a non-daemon ``multiprocessing`` child (fork) that sleeps 600 s
                         and write its pid to ``path``: multiprocessing's exit hook joins it
  {"close_channel": true} close every socket the worker holds (its channel to the frontend)
  {"scribble": true}     write 64 bytes of 0xff into every socket the worker holds
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


def _sockets() -> list[int]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                found.append(int(name))
        except OSError:  # the listing's own descriptor, gone already
            continue
    return found


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
            for fd in _sockets() if body.get("close_channel") else ():
                os.close(fd)
            for fd in _sockets() if body.get("scribble") else ():
                os.write(fd, b"\xff" * 64)
        return [{"pid": os.getpid()} for _ in data]
