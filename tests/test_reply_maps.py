"""cuptistream/collector/reply_maps.py: decode workers' replies land in private mappings that are
reused once no view points into them, and never while one does. Real mappings and a real socket
pair; nothing mocked."""

from __future__ import annotations

import os
import threading

from cuptistream.collector import worker_protocol as wp
from cuptistream.collector.reply_maps import ReplyMaps
from tests.shared_writes import overlapping_writes

MIB = 1 << 20


def test_a_mapping_is_handed_out_again_only_once_its_views_are_gone() -> None:
    maps = ReplyMaps(idle_bytes=8 * MIB)
    first = maps.take(3 * MIB)
    mapping = first.obj
    part = first[100:200]  # a slice, as a reply's payloads are
    del first
    second = maps.take(MIB)  # the first mapping is still pointed into: a new one
    assert second.obj is not mapping and maps.created == 2 and maps.reused == 0
    del part
    third = maps.take(2 * MIB)  # now idle, and big enough: reused, its pages already in
    assert third.obj is mapping and len(third) == 2 * MIB and maps.reused == 1
    assert len(mapping) == 3 * MIB  # sizes round up to whole MiB; a smaller reply fits a bigger one
    del second, third
    assert maps.take(5 * MIB).obj is not mapping  # too small for this one: a new mapping of 5 MiB


def test_idle_mappings_beyond_the_bound_are_unmapped() -> None:
    maps = ReplyMaps(idle_bytes=2 * MIB)
    views = [maps.take(MIB) for _ in range(5)]
    mappings = [v.obj for v in views]
    views.clear()  # all five idle now
    kept = maps.take(MIB)
    # One is taken, two more (2 MiB) are kept idle, the other two unmapped.
    assert kept.obj in mappings
    assert sum(m.closed for m in mappings) == 2
    maps.close()
    assert not kept.obj.closed  # still pointed into: it goes with its last view
    assert sum(m.closed for m in mappings) == 4


def test_threads_never_share_a_mapping_in_use() -> None:
    maps = ReplyMaps(idle_bytes=16 * MIB)
    assert overlapping_writes(lambda: maps.take(MIB // 2), rounds=200) == []
    assert maps.reused > maps.created  # and they did reuse


def test_replies_through_the_socket_reuse_a_mapping_and_never_overwrite_a_held_one() -> None:
    maps = ReplyMaps(idle_bytes=32 * MIB)
    ours, theirs = wp.pair()
    try:

        def reply(payload: bytes) -> wp.Reply | None:
            message = wp.Reply(calls=[wp.EmitChunk(payload, 1, 1)], events=1)
            sender = threading.Thread(target=wp.send_reply, args=(theirs, message))
            sender.start()
            got = wp.receive_reply(ours, maps)
            sender.join()
            return got

        a, b, c = (os.urandom(700_000) for _ in range(3))  # several 128 KiB fragments each
        first = reply(a)
        assert first is not None
        held = first.calls[0].payload  # a sink still holds the first reply's events
        second = reply(b)
        assert second is not None and bytes(held) == a  # the second landed elsewhere
        assert second.calls[0].payload.obj is not held.obj
        mapping = held.obj
        del first, held
        third = reply(c)  # the first's mapping is free again
        assert third is not None and bytes(third.calls[0].payload) == c
        assert third.calls[0].payload.obj is mapping and maps.reused == 1
    finally:
        ours.close()
        theirs.close()


def test_a_mapping_whose_state_cannot_be_told_is_forgotten_not_reused() -> None:
    maps = ReplyMaps(idle_bytes=8 * MIB)
    view = maps.take(MIB)
    mapping = view.obj
    del view
    mapping.close()  # resize now fails with ValueError: the pool cannot tell whether it is free
    fresh = maps.take(MIB)
    assert fresh.obj is not mapping and maps.created == 2 and maps.reused == 0
    del fresh
    assert maps.take(MIB).obj is not mapping and maps.reused == 1  # only the live one is reused


def test_a_mapping_much_larger_than_the_reply_is_not_handed_out() -> None:
    """The memory budget counts a reply's whole mapping (``ChunkGroup``): a 1 MiB reply in an idle
    10 MiB mapping would count ten times its bytes."""
    maps = ReplyMaps(idle_bytes=16 * MIB)
    big = maps.take(10 * MIB)
    mapping = big.obj
    del big
    small = maps.take(MIB)
    assert small.obj is not mapping and maps.reused == 0
    del small
    assert maps.take(6 * MIB).obj is mapping  # within twice the reply (and a MiB): reused
