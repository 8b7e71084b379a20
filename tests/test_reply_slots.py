"""cuptistream/collector/reply_slots.py: the shared-memory slots decode workers pack replies into
(``pipeline.worker_replies: shared``). A slot is named again only once no view points into it,
never while a reply's chunk or a request's hold does; what a worker writes through a second
mapping of the same memfd is what the collector reads. Real memfds and mappings; nothing mocked."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from cuptistream.collector.reply_slots import ARENA_BYTES, Arena, ReplySlots, SlotWriter
from tests.shared_writes import overlapping_writes

MIB = 1 << 20


def _worker_mapping(fd: int, size: int) -> mmap.mmap:
    """The slot as a decode worker maps it: its own mapping of the memfd that came with a request."""
    return mmap.mmap(os.dup(fd), size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def test_a_slot_is_named_again_only_once_its_hold_and_views_are_gone() -> None:
    slots = ReplySlots(max_bytes=64 * MIB, idle_bytes=16 * MIB)
    first = slots.take(3 * MIB)
    assert first is not None and first.size == 3 * MIB  # whole MiB
    second = slots.take(MIB)  # the first is held by its request: another slot
    assert second is not None and second.slot != first.slot and slots.created == 2
    chunk = slots.view(first.slot, 100, 50)  # a reply's chunk
    first.release()
    second.release()
    again = slots.take(2 * MIB)  # slot 1 fits (1 MiB is too small), but a chunk still views it
    assert again is not None and again.slot not in (first.slot, second.slot) and slots.created == 3
    again.release()
    del chunk
    reused = slots.take(3 * MIB)  # the smallest idle slot that fits: the first, no longer viewed
    assert reused is not None and reused.slot == first.slot and slots.created == 3
    assert slots.taken == 4


def test_what_the_worker_packs_is_what_the_collector_reads() -> None:
    slots = ReplySlots(max_bytes=8 * MIB, idle_bytes=8 * MIB)
    taken = slots.take(MIB)
    assert taken is not None
    mapping = _worker_mapping(taken.fd, taken.size)
    writer = SlotWriter(taken.slot, mapping)
    parts = [writer.allocate(n) for n in (13, 1000, 8)]
    assert all(p is not None for p in parts)
    offsets = [writer.locate(p.data) for p in parts if p is not None]
    assert offsets == [0, 16, 1016]  # in order, each 8-byte aligned
    for part, fill in zip(parts, (1, 2, 3), strict=True):
        assert part is not None
        part[:] = fill
    assert slots.view(taken.slot, 16, 1000).tobytes() == bytes([2]) * 1000
    assert slots.view(taken.slot, 1016, 8).tobytes() == bytes([3]) * 8
    writer.release()
    del parts, part
    mapping.close()


def test_a_links_replies_share_its_slot_until_one_does_not_fit() -> None:
    slots = ReplySlots(max_bytes=64 * MIB, idle_bytes=16 * MIB)
    arena = Arena(slots)
    first = arena.place(MIB)
    assert first is not None and first[1] == 0 and first[0].size == ARENA_BYTES
    taken = first[0]
    mapping = _worker_mapping(taken.fd, taken.size)
    chunks = []
    # The first reply's events reached 1 MiB + 3: the next one goes after them, 8-byte aligned.
    arena.packed(MIB + 3, MIB)
    second = arena.place(MIB)
    assert second is not None and second[0] is taken and second[1] == MIB + 8
    writer = SlotWriter(taken.slot, mapping, second[1])
    part = writer.allocate(100)
    assert part is not None and writer.locate(part.data) == MIB + 8  # the worker writes from there on
    part[:] = 5
    chunks.append(slots.view(taken.slot, MIB + 8, 100))
    assert chunks[0].tobytes() == bytes([5]) * 100
    writer.release()
    del part
    arena.packed(2 * MIB, MIB)
    third = arena.place(3 * MIB)  # 2 + 3 MiB > 4: another slot; the first is the sinks' until they let go
    assert third is not None and third[0].slot != taken.slot and third[1] == 0
    assert slots.take(ARENA_BYTES) is not None and slots.created == 3  # a chunk still views the first
    chunks.clear()
    again = slots.take(ARENA_BYTES)
    assert again is not None and again.slot == taken.slot  # idle now: nothing views it
    assert slots.replies == 3 and slots.taken == 4
    again.release()
    # A reply that leaves no room for the next one like it lets the slot go at once, not at the
    # next reply: the link holds no slot it will not use (a GPU's replies fill one each).
    arena.packed(3 * MIB, 2 * MIB)
    after = slots.take(ARENA_BYTES)  # the least recently taken idle slot: third's, let go already
    assert after is not None and after.slot == third[0].slot and slots.created == 3
    after.release()
    arena.release()
    mapping.close()


def test_a_writer_says_none_when_full_and_knows_only_its_own_arrays() -> None:
    mapping = mmap.mmap(-1, 4096)
    writer = SlotWriter(7, mapping)
    whole = writer.allocate(4000)
    assert whole is not None
    assert writer.allocate(97) is None  # 4000 + 97 > 4096: the packer uses its heap instead
    assert writer.allocate(96) is not None  # 4000 rounds to 4000; 4096 fits exactly
    assert writer.locate(whole.data) == 0
    assert writer.locate(whole[10:].data) is None  # a part of one is not a chunk it handed out
    assert writer.locate(np.zeros(10, np.uint8).data) is None
    assert writer.locate(b"bytes") is None
    writer.release()
    assert writer.locate(whole.data) is None  # after the reply, nothing
    del whole


def test_no_slot_past_max_bytes_and_out_of_range_views_refused() -> None:
    slots = ReplySlots(max_bytes=4 * MIB, idle_bytes=0)
    held = slots.take(3 * MIB)
    assert held is not None
    assert slots.take(2 * MIB) is None and slots.full == 1  # 3 + 2 MiB > 4: the socket instead
    with pytest.raises(ValueError, match="outside"):
        slots.view(held.slot, 3 * MIB - 10, 11)
    held.release()


def test_idle_slots_beyond_the_bound_give_their_pages_back() -> None:
    slots = ReplySlots(max_bytes=64 * MIB, idle_bytes=MIB)
    a, b = slots.take(MIB), slots.take(2 * MIB)
    assert a is not None and b is not None
    for taken in (a, b):
        _worker_mapping(taken.fd, taken.size)[:] = b"\x07" * taken.size  # the worker fills them
        taken.release()
    held = slots.take(5 * MIB)  # neither fits: a and b are idle, and only 1 MiB may stay resident
    assert held is not None and held.slot not in (a.slot, b.slot)
    # a (1 MiB) stays within the bound with its bytes; b's pages went back (they read as zeros).
    assert slots.view(a.slot, 0, 8).tobytes() == b"\x07" * 8
    assert slots.view(b.slot, 0, 8).tobytes() == bytes(8)
    held.release()


def test_a_slot_whose_pages_are_in_is_named_before_one_that_gave_them_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cuptistream.collector import reply_slots

    slots = ReplySlots(max_bytes=64 * MIB, idle_bytes=MIB)
    a, b = slots.take(MIB), slots.take(MIB)
    assert a is not None and b is not None and a.slot != b.slot
    for taken in (a, b):
        _worker_mapping(taken.fd, taken.size)[:] = b"\x07" * taken.size
        taken.release()
    held = slots.take(5 * MIB)  # no idle slot fits: the trim keeps b (the more recent), gives a back
    assert held is not None
    assert slots.view(a.slot, 0, 8).tobytes() == bytes(8)
    again = slots.take(MIB)  # a was taken longer ago, but b's pages are in: no faults for the worker
    assert again is not None and again.slot == b.slot
    assert slots.view(b.slot, 0, 8).tobytes() == b"\x07" * 8
    again.release()
    # With the trim due at every take, one that finds an idle slot still trims the others: a
    # second 5 MiB slot, idle and beyond the bound with b kept, gives its pages back.
    monkeypatch.setattr(reply_slots, "TRIM_INTERVAL_S", 0.0)
    second = slots.take(5 * MIB)  # held's slot is still held: a new one
    assert second is not None and second.slot != held.slot
    _worker_mapping(second.fd, second.size)[:8] = b"\x09" * 8
    second.release()
    held.release()
    last = slots.take(MIB)
    assert last is not None and last.slot == b.slot
    assert slots.view(second.slot, 0, 8).tobytes() == bytes(8)
    last.release()


def test_a_take_after_close_makes_a_fresh_slot() -> None:
    slots = ReplySlots(max_bytes=8 * MIB, idle_bytes=8 * MIB)
    first = slots.take(MIB)
    assert first is not None
    first.release()
    slots.close()
    again = slots.take(MIB)  # none of the forgotten slots is named again
    assert again is not None and again.slot == 0 and slots.created == 2
    again.release()
    slots.close()


def test_threads_never_share_a_slot_in_use() -> None:
    slots = ReplySlots(max_bytes=64 * MIB, idle_bytes=16 * MIB)

    def take() -> memoryview | None:  # as a connection does: its chunks view the slot, then the hold goes
        taken = slots.take(MIB // 2)
        if taken is None:
            return None
        view = slots.view(taken.slot, 0, MIB // 2)
        taken.release()
        return view

    assert overlapping_writes(take) == []
    assert slots.taken > 0
    slots.close()


def test_a_worker_asked_for_a_slot_it_never_mapped_sends_the_events_over_the_socket() -> None:
    """A decode worker's ``Session`` (in this process): a ``Decode`` naming a reply slot whose memfd
    never reached it still gets every event back, as ``EmitChunk``s, rather than failing."""
    import socket

    from cuptistream.channel.messages import OpenStream
    from cuptistream.channel.shm import ACTIVITY, SlotPool
    from cuptistream.collector import worker_protocol as wp
    from cuptistream.collector.workers import Session
    from cuptistream.cupti import capture
    from cuptistream.sources.replay import DEFAULT_PATH

    cap = capture.read(DEFAULT_PATH / "torch_train.cupti")
    buf = cap.buffers[0]
    pool = SlotPool.create("test", len(buf.data) + 8, 1)
    ours, theirs = socket.socketpair()
    session = Session(theirs)
    try:
        info = OpenStream(
            stream=1, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings)
        )
        assert session.serve(wp.Open(info, 0, statistics=False), []).problem is None
        assert session.serve(wp.MapPool(0, pool.slot_size, pool.slots), [os.dup(pool.fd)]).problem is None
        slot = pool.take()
        assert slot is not None
        pool.view(slot)[: len(buf.data)] = buf.data
        pool.publish(slot, ACTIVITY, 1, len(buf.data))
        reply = session.serve(wp.Decode(1, 0, slot, len(buf.data), 0, reply_slot=5, reply_slot_size=MIB), [])
        assert reply.problem is None
        chunks = [c for c in reply.calls if isinstance(c, wp.EmitChunk)]
        assert chunks and not any(isinstance(c, wp.EmitSlotChunk) for c in reply.calls)
        assert sum(c.count for c in chunks) == reply.events > 0
    finally:
        session.close()
        ours.close()
        pool.close()
