"""A worker's log records: one line each on stderr, read by the frontend's WorkerOutput
(server/observe/logfiles.py), text or JSON, each after the frontend's secret tag so that the
frontend can tell them from what a handler prints (server/serving/worker_env.LOG_TAG)."""

from __future__ import annotations

import logging
import os
import sys

from torchbay.server.serving.worker_env import LOG_TAG


def configure_logging(level: str, log_format: str) -> None:
    """The worker's log lines on stderr (the frontend's WorkerOutput), text or JSON, each
    record's first line after the frontend's secret (``LOG_TAG``, taken out of the environment:
    the handler and its children never see it)."""
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter
    if log_format == "json":
        from torchbay.server.observe.logs import JsonFormatter

        formatter = JsonFormatter()
    else:
        formatter = logging.Formatter(
            f"%(asctime)s %(levelname)s worker[{os.getpid()}] %(name)s: %(message)s"
        )
    tag = os.environ.pop(LOG_TAG, "")
    handler.setFormatter(_Tagged(formatter, tag) if tag else formatter)
    # force: a forked worker replaces what its template set up (server/worker/template.py).
    logging.basicConfig(level=level, handlers=[handler], force=True)


class _Tagged(logging.Formatter):
    """``inner``'s text with ``tag`` before it."""

    def __init__(self, inner: logging.Formatter, tag: str) -> None:
        super().__init__()
        self.inner, self.tag = inner, tag

    def format(self, record: logging.LogRecord) -> str:
        return self.tag + self.inner.format(record)
