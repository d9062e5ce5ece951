"""The handlers' exception tree (imports nothing of ours, nor torch).

    HandlerError                       base of every handler-side failure
    ├── HandlerLoadError               the model or handler failed to load (unknown handler name,
    │                                  missing file, bad module, unreadable weights...)
    └── PredictionException            raised by a handler during inference; TorchServe's
        │                              ``PredictionException(message, error_code=500)``
        └── BadInput                   one request's input is unusable (error_code 400)

The Service maps a ``PredictionException`` escaping ``handle()`` to its ``error_code`` for the whole
batch; a ``BadInput`` raised inside ``BaseHandler.map_items`` fails only its own request.
"""

from __future__ import annotations


class HandlerError(Exception):
    """Base of every error raised by ``torchbay.handlers``."""


class HandlerLoadError(HandlerError):
    """The model or handler could not be loaded; the message names the file or handler."""


class PredictionException(HandlerError):
    """TorchServe-compatible inference error carrying the HTTP status to answer with."""

    def __init__(self, message: str, error_code: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.error_code = int(error_code)

    def __str__(self) -> str:
        return f"{self.message} : {self.error_code}"


class BadInput(PredictionException):
    """One request's input is invalid: answered 400 (only that request, inside map_items)."""

    def __init__(self, message: str, error_code: int = 400) -> None:
        super().__init__(message, error_code)
