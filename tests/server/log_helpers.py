"""What the logging tests share: an access request's ASGI scope, and the root logger given to a
test with its handlers and level put back afterwards (:func:`kept_root_logging`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/predictions/m",
    "http_version": "1.1",
    "client": ("127.0.0.1", 5000),
}


@contextlib.contextmanager
def kept_root_logging() -> Iterator[logging.Logger]:
    """The root logger; its handlers and level are put back at the end."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield root
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
