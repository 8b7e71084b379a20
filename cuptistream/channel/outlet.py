"""``PoolOutlet``: an ``ActivityOutlet`` whose buffers are the slots of a ``SlotPool``.

Subclasses say what completing a buffer means: publish it to the collector (the probe's
``SlotOutlet``) or decode it on the spot (``InlineOutlet``, for tests and tools).
"""

from __future__ import annotations

import time

from cuptistream.channel.shm import SlotPool
from cuptistream.component import ActivityOutlet

_SLOT_POLL_S = 0.001


class PoolOutlet(ActivityOutlet):
    def __init__(self, pool: SlotPool) -> None:
        self.pool = pool
        self.slot_size = pool.slot_size

    def take(self) -> int | None:
        slot = self.pool.take()
        return None if slot is None else self.pool.address(slot)

    def owns(self, address: int) -> bool:
        return self.pool.slot_of(address) is not None

    def give_back(self, address: int) -> None:
        slot = self.pool.slot_of(address)
        if slot is not None:
            self.pool.unpublish(slot)

    def write(self, data: bytes, dropped: int = 0, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while (address := self.take()) is None:
            if time.monotonic() > deadline or not self.reader_alive():
                return False
            time.sleep(_SLOT_POLL_S)
        slot = self.pool.slot_of(address)
        assert slot is not None
        self.pool.view(slot, len(data))[:] = data
        self.complete(address, len(data), dropped)
        return True

    def reader_alive(self) -> bool:
        """Whether something will free the slots (worth waiting for one)."""
        return True

    def wait_consumed(self, timeout: float) -> bool:
        """Wait until every completed buffer has been read (here: at once)."""
        return True
