"""The probe's shared-memory slots (a real memfd pool) after ``cuptiFinalize`` between windows."""

from __future__ import annotations

from cuptistream.channel.outlet import PoolOutlet
from cuptistream.channel.shm import ACTIVITY, FILLING, FREE, READY, SlotPool


class Outlet(PoolOutlet):
    def complete(self, address: int, valid: int, dropped: int = 0) -> None:
        raise AssertionError("not used here")


def test_reclaim_frees_the_buffers_cupti_held_and_keeps_those_handed_over() -> None:
    """CUPTI never completes the buffers it held when it detached: without reclaiming, every
    detach between windows would lose them and the pool would run dry after a few windows."""
    pool = SlotPool.create("reclaim", 64 * 1024, 4)
    outlet = Outlet(pool)
    held = [outlet.take() for _ in range(3)]
    assert all(address is not None for address in held)
    published = pool.slot_of(held[0] or 0)
    assert published is not None
    pool.publish(published, ACTIVITY, stream=1, valid=128)
    assert outlet.reclaim() == 2
    assert pool.headers["state"].tolist().count(FILLING) == 0
    assert pool.headers["state"][published] == READY  # the collector still reads it
    assert pool.headers["state"].tolist().count(FREE) == 3
    assert outlet.reclaim() == 0


def test_ready_lists_the_ready_slots_in_publication_order_whatever_their_places() -> None:
    """The collector decodes a probe's buffers in the order the probe published them: ``ready``
    sorts by publication, not by slot, and leaves out the slots being filled or free."""
    pool = SlotPool.create("ready", 4096, 8)
    slots = [pool.take() for _ in range(6)]
    assert slots == [0, 1, 2, 3, 4, 5]
    for slot in (4, 1, 5, 0):  # published out of slot order; 2 and 3 are still filling
        pool.publish(slot, ACTIVITY, stream=1, valid=8)
    assert pool.ready() == [4, 1, 5, 0]
    pool.release(1)
    assert pool.ready() == [4, 5, 0]
    assert SlotPool.create("empty", 4096, 4).ready() == []
