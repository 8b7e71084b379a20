"""``PoolOutlet``: an ``ActivityOutlet`` whose buffers are the slots of a ``SlotPool``.

Subclasses say what completing a buffer means: publish it to the collector (the probe's
``SlotOutlet``) or decode it on the spot (``InlineOutlet``, for tests and tools).
"""

from __future__ import annotations

import abc
import time
from typing import TYPE_CHECKING

from cuptistream.channel.shm import SlotPool

if TYPE_CHECKING:
    from cuptistream.channel.messages import TraceSpan

_SLOT_POLL_S = 0.001


class ActivityOutlet(abc.ABC):
    """Where a source hands raw CUPTI activity buffers: slots of shared memory the collector decodes.

    ``take`` and ``complete`` do O(1) work and never wait, so they are safe on CUPTI's threads.
    """

    slot_size: int

    @abc.abstractmethod
    def take(self) -> int | None:
        """The address of a free buffer of ``slot_size`` bytes, or None when all are in use."""

    @abc.abstractmethod
    def complete(self, address: int, valid: int, dropped: int = 0) -> None:
        """Hand the buffer at ``address`` (``valid`` bytes of records) to the collector."""

    @abc.abstractmethod
    def give_back(self, address: int) -> None:
        """Return a buffer that holds nothing worth decoding."""

    def owns(self, address: int) -> bool:
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """The source is done: no buffer is taken or completed after this."""

    def write(self, data: bytes, dropped: int = 0, timeout: float = 30.0) -> bool:
        """Copy ``data`` into a buffer and hand it over, waiting up to ``timeout`` for a free one
        (for sources that are not on CUPTI's threads, e.g. replay). False: no buffer came free."""
        raise NotImplementedError

    def send_trace_span(self, span: TraceSpan, wait: float = 2.0) -> bool:
        """Tell the collector that this outlet's stream traced a window: ``span`` (its ``stream``
        is set here) once when the window opens (``end`` 0) and once when it closes. Send the close
        only after the window's last buffer was ``complete``d (after CUPTI's forced flush): it
        travels behind the buffers' hand-offs, so the collector has decoded them when it reads it.

        Waits up to ``wait`` seconds for room in the channel, so never call it on a CUPTI callback
        thread with ``wait`` > 0. False: not sent (no collector now, the channel stayed full, or an
        outlet without a collector, as here: the base class sends nothing)."""
        return False


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

    def reclaim(self) -> int:
        """After ``cuptiFinalize``: the buffers CUPTI still held are free again; how many."""
        return self.pool.reclaim_filling()

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
