"""Retiring worker slots (a scale down, an eviction): each finishes the batch it holds, stops
its worker and leaves its model version's ``slots``. A scale down is answered once the idle
slots stopped, as TorchServe 0.12 answers it at once: a slot running a batch takes no other
from then on and finishes it in the background, its request answered. Torch-free."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchbay.server.serving.slot import WorkerSlot

__all__ = ["retire"]

_leaving: set[asyncio.Task] = set()  # slots that finish their batch after a scale down


async def retire(
    slots: list[WorkerSlot], leaving: list[WorkerSlot], busy_later: bool = False
) -> None:
    """Retire ``leaving`` and take each out of ``slots`` once its worker stopped; return once
    all of them stopped, or (``busy_later``) those that hold no batch."""
    waited = []
    for slot in leaving:
        slot.retiring = True  # from now on it takes no batch
        task = asyncio.ensure_future(_retired(slots, slot))
        _leaving.add(task)
        task.add_done_callback(_leaving.discard)
        if not (busy_later and slot.busy):
            waited.append(task)
    await asyncio.gather(*waited)


async def _retired(slots: list[WorkerSlot], slot: WorkerSlot) -> None:
    await slot.retire()
    if slot in slots:
        slots.remove(slot)
