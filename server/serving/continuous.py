"""Continuous batching of a sequence model (TorchServe's ``continuousBatching: true`` with
``sequenceBatching: true``, its ``SequenceContinuousBatching``), frontend side. Torch-free.

A slot runs such a model one handler call at a time. After each call, a request whose answer
carries ``ts_stream_next: true`` (its handler's stopping criterion said more is to come, see
handlers/runtime/continuous.py) is not answered yet: that answer goes to its caller as a
streamed part, and the request is sent again with the slot's next call, marked continued and
without its body. Its sequence is released all the same, so the sequence's next request (a
cancel, say) joins the next call beside it, and the other sequences' requests join as they
come: a call holds the continued requests plus new ones, up to twice the batch size in all
(TorchServe's hard-coded limit). While requests are continued the slot does not wait for new
ones. A sequence is not closed for idling while one of its requests streams.

A handler ends a sequence by setting ``ts_request_sequence_end`` (or the name the server's
``ts_header_key_sequence_end`` gives it; any case) on an answer (its id, or several ids joined
by ``;``): the sequence takes no new request (the next one is refused: it
has ended) and closes once its queued and running ones are answered. A continued request whose
caller left is dropped before the next call (TorchServe drops it too); the handler keeps
whatever state it holds for it. One whose worker was restarted or recycled meanwhile is
answered 503 (``SequenceLost``), never continued on a fresh handler. The ``ts_stream_next``
header never reaches the caller.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchbay.server.errors import HandlerFailed, TorchbayError
from torchbay.server.serving import protocol as p
from torchbay.server.serving.batches import BatchRecord, batch_record
from torchbay.server.serving.handle import WorkerProcess
from torchbay.server.serving.launch import ModelSettings
from torchbay.server.serving.queue import Pending, clock, reject, resolve
from torchbay.server.serving.sequence_types import Sequence, SequenceLost
from torchbay.server.serving.sequences import SequenceQueue
from torchbay.server.serving.streams import BatchStreams

# A continued request's ``protocol`` (handlers/runtime/continuous.py): the frontend's own
# mark, which no client can set (a header could be forged).
CONTINUED = "continued"
STREAM_NEXT = "ts_stream_next"

Item = Pending[p.WireRequest, p.WireResponse]


class ContinuousSequenceQueue(SequenceQueue):
    """A ``SequenceQueue`` whose ``take`` also serves a slot that holds continued requests."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rooms: dict[Any, int] = {}  # a slot's room for new requests in its next call
        self._sequence_of: dict[Pending, Sequence] = {}  # requests taken and not yet answered
        self._streaming: set[Pending] = set()  # those of them that answered a part

    async def take(self, slot: Any = None, carried: int = 0) -> list[Pending]:
        """``slot``'s new requests for its next call, which also holds ``carried`` continued
        ones: at most one per sequence, none past the room left. With continued requests it
        returns at once, perhaps with none; without, it waits for a non-empty batch."""
        self._rooms = {s: room for s, room in self._rooms.items() if s in self._slots}
        self._rooms[slot] = max(0, 2 * self.batch_size - carried)
        if not carried:
            return await super().take(slot)
        self._joined(slot)
        self._release(slot)
        now = clock()
        self._sweep(now)
        self._bind(slot)
        return self._pick(slot, now)

    def _pick(self, slot: Any, now: float) -> list[Pending]:
        ready = [s for s in self.open.values() if s.slot is slot and s.items and not s.running]
        ready.sort(key=lambda s: s.items[0].arrival)
        batch = []
        for seq in ready[: self._rooms.get(slot, 2 * self.batch_size)]:
            item = self._took(seq, now)
            self._sequence_of[item] = seq
            batch.append(item)
        return batch

    def streaming(self, item: Pending) -> None:
        """``item`` answered a part and goes on in the next call."""
        seq = self._sequence_of.get(item)
        if seq is not None and item not in self._streaming:
            seq.streaming += 1
            self._streaming.add(item)

    def answered(self, item: Pending) -> None:
        """``item`` is done (answered, failed, or its caller left)."""
        seq = self._sequence_of.pop(item, None)
        if seq is not None and item in self._streaming:
            self._streaming.discard(item)
            seq.streaming -= 1
            seq.last = clock()
            self._arm()

    def finish(self, sequence_id: str) -> None:
        """The handler ended ``sequence_id``: nothing more joins it; it closes once done."""
        seq = self.open.get(sequence_id)
        if seq is None:
            return
        if any(item is seq.restart for item in seq.items):  # a start queued since: a new
            self._ended_before(seq, seq.restart)  # sequence under the id, which goes on
            return
        seq.ending, seq.end_request = True, None  # ended by the handler, whatever leaves
        if not seq.items and not seq.running:
            self._end(seq, "has ended", "end")

    def _ended_before(self, seq: Sequence, start: Any) -> None:
        """The handler ended the sequence before ``start`` (queued): counted as ended once its
        request is answered, and ended still should ``start`` leave before it runs."""
        if start in seq.superseded:
            return
        seq.superseded[start] = None
        if seq.running:
            seq.end_ran = True
        else:
            self.ended["end"] += 1

    def requeue_front(self, items: Any) -> None:
        items = list(items)
        for item in items:
            self.answered(item)
        super().requeue_front(items)


class Carry:
    """One slot's continued requests, between its calls."""

    def __init__(self, queue: ContinuousSequenceQueue) -> None:
        self.queue = queue
        self.items: list[Item] = []  # continued into the next call
        self.worker: WorkerProcess | None = None  # the one that holds their state
        self._carried: set[Item] = set()  # every request that answered a part and goes on

    async def take(self, slot: Any) -> list[Item]:
        """The slot's next call: its continued requests whose callers wait, then new ones."""
        carried = []
        lost = getattr(slot, "worker", None) is not self.worker  # restarted or recycled
        for item in self.items:
            if lost:  # its state died with the worker: never continued on a fresh one
                reject(item.future, SequenceLost("The worker of this sequence died; not run"))
                self.queue.answered(item)
            elif item.future.done():  # its caller left
                self._carried.discard(item)
                self.queue.answered(item)
            else:
                carried.append(item)
        self.items = []
        return carried + await self.queue.take(slot, carried=len(carried))

    async def run(
        self, worker: WorkerProcess, batch: list[Item], settings: ModelSettings, key: str
    ) -> BatchRecord | None:
        """One call on ``worker``: answer, or stream a part of, each request of ``batch``."""
        self.worker = worker
        streams = BatchStreams(worker, batch, settings.max_response_size, key)
        payloads = [_continued(i.payload) if i in self._carried else i.payload for i in batch]
        started = clock()
        try:
            timeout = settings.response_timeout_s or None
            result = await worker.infer(payloads, timeout, streams.on_part)
            if len(result.responses) != len(batch):
                raise HandlerFailed("The worker answered the wrong number of results")
            for item, response in zip(batch, result.responses, strict=True):
                self._one(item, response, streams, settings.sequence_headers[2])
        except TorchbayError as exc:  # WorkerDied, RequestTimeout, HandlerFailed
            for item in batch:
                reject(item.future, type(exc)(exc.message))
                self.queue.answered(item)
            self.items = []
            self._carried.clear()
            return None
        finally:
            streams.close()
        self._carried = set(self.items)
        return batch_record(batch, result, started)

    def _one(
        self, item: Item, response: p.WireResponse, streams: BatchStreams, end_name: str
    ) -> None:
        headers = dict(response.headers)
        more = headers.pop(STREAM_NEXT, None) == "true"
        ended = [v for k, v in headers.items() if k.lower() == end_name]
        for sequence_id in ended_sequences(ended[-1] if ended else "", self.queue.open):
            self.queue.finish(sequence_id)
        response = dataclasses.replace(response, headers=headers)
        if more and not item.future.done() and response.status < 400:
            part = dataclasses.replace(response, partial=True)
            streams.on_part(p.Part(0, item.payload.request_id, part))
            self.queue.streaming(item)
            self._carried.add(item)
            self.items.append(item)
            return
        resolve(item.future, response)
        self.queue.answered(item)


def _continued(wire: p.WireRequest) -> p.WireRequest:
    """``wire`` sent again: its id and headers, no body (its handler had it), marked."""
    return dataclasses.replace(wire, body=b"", protocol=CONTINUED)


def ended_sequences(value: str, open_ids: Any) -> list[str]:
    """The sequences a handler's end header names: TorchServe's ``;``-joined ids, or the whole
    value when it is one open sequence's id (a client's id may hold a ``;``: naming its own
    sequence ``victim;x`` must not end the sequence ``victim``)."""
    value = value.strip()
    if value in open_ids:
        return [value]
    return [part.strip() for part in value.split(";") if part.strip()]
