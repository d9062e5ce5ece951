"""The data plane: the one object every protocol calls (``plane.py``), one request's steps
(``exchange.py``), the model operations (``models.py``). Protocol code (``http``, ``grpc``)
reaches ``serving`` only through here; the names it uses are re-exported below."""

from torchbay.server.plane.exchange import CLIENT_LEFT, Exchange
from torchbay.server.plane.plane import DataPlane, build_plane, extensions_of
from torchbay.server.serving.admission import any_pressed
from torchbay.server.serving.model import ModelStatus, ModelVersion
from torchbay.server.serving.protocol import WireRequest, WireResponse, join_headers
from torchbay.server.serving.streams import Gathered

__all__ = [
    "CLIENT_LEFT",
    "DataPlane",
    "Exchange",
    "Gathered",
    "ModelStatus",
    "ModelVersion",
    "WireRequest",
    "WireResponse",
    "any_pressed",
    "build_plane",
    "extensions_of",
    "join_headers",
]
