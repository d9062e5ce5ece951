"""What the sequence scheduler (serving/sequences.py) knows of a sequence: what a request says
of it (:class:`SequenceRef`), an open sequence, an ended one, the errors a sequence's request
gets, and whether a slot still holds a sequence's state. Torch-free."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from torchbay.server.errors import BadRequest, ServiceUnavailable
from torchbay.server.serving.queue import Pending


class SequenceRefused(BadRequest):
    """A request that cannot join the sequence it names (closed, ended, not started)."""

    code = "sequence_refused"


class SequenceCancelled(BadRequest):
    """A queued request of a sequence that Triton's API opened was cancelled (its caller
    left): the sequence ends and its other queued requests are answered so, as Triton's
    sequence batcher answers them CANCELLED (HTTP 400, gRPC CANCELLED: grpc/status.py)."""

    code = "sequence_cancelled"


class SequenceLost(ServiceUnavailable):
    """The worker that held a sequence's state died or was replaced: the sequence is over."""

    code = "sequence_lost"


class SequenceExpired(ServiceUnavailable):
    """A request's ``timeout`` passed while its sequence waited for a slot (Triton's backlog):
    the sequence's queued requests are answered so, as Triton's UNAVAILABLE."""

    code = "sequence_expired"


@dataclass(frozen=True, slots=True)
class SequenceRef:
    """What a request says of its sequence (parsed by the plane, plane/sequence_params.py).
    ``implicit``: an unknown id opens a sequence without ``start`` (TorchServe's API)."""

    id: str | int
    start: bool = False
    end: bool = False
    implicit: bool = False


@dataclass(eq=False, slots=True)
class Sequence:
    id: str | int
    opened: float
    last: float  # clock() of its last arrival or answer: the idle limit counts from here
    items: collections.deque[Pending] = field(default_factory=collections.deque)
    slot: Any = None  # the slot it is bound to (None: not yet)
    worker: Any = None  # that slot's worker when bound: its state lives there
    running: bool = False  # one of its requests is in a batch
    ending: bool = False  # its end request is queued: nothing more joins
    end_request: Pending | None = None  # that request (None: none, or the handler ended it)
    ran: bool = False  # a worker took one of its requests (or it is an idle one reopened)
    streaming: int = 0  # its requests still answering over several calls (continuous batching)
    implicit: bool = False  # opened by TorchServe's API (see SequenceRef)
    restart: Pending | None = None  # the last start that joined it while open (queue.put)
    # each queued start that joined it after its end request: that end request while queued
    # (None: it ran, or the handler ended the sequence; counted then)
    superseded: dict[Pending, Pending | None] = field(default_factory=dict)
    expires: float | None = None  # unbound: clock() its requests' earliest timeout passes at
    end_ran: bool = False  # its running request is such an end: counted once answered


@dataclass(frozen=True, slots=True)
class Ended:
    reason: str
    slot: Any = None
    worker: Any = None
    idle: bool = False  # closed for idling (TorchServe's API may reopen it on its worker)


def slot_alive(slot: Any) -> bool:
    worker = getattr(slot, "worker", None)
    return (
        worker is not None
        and getattr(worker, "alive", True)
        and not getattr(slot, "retiring", False)
        and not getattr(slot, "gave_up", False)
    )


def gone_for_good(slot: Any) -> bool:
    """``slot`` will never take again (retired, or its restarts given up)."""
    return bool(getattr(slot, "retiring", False) or getattr(slot, "gave_up", False))


def holds(seq: Sequence) -> bool:
    """The slot a sequence is bound to still serves with the worker that holds its state."""
    return slot_alive(seq.slot) and getattr(seq.slot, "worker", None) is seq.worker


def lives(ended: Ended) -> bool:
    return (
        ended.slot is not None
        and getattr(ended.slot, "worker", None) is ended.worker
        and (slot_alive(ended.slot))
    )
