"""Test helper: put an activity buffer in a real shared-memory slot, as a probe publishes it, and
hand it to a decode (``RemoteStream.decode_slots``, ``DecodeStream.decode``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuptistream.channel.shm import ACTIVITY, SlotPool
from cuptistream.collector.decoding import Buffer

Decode = Callable[[int, Buffer], None]


def through_slot(
    pool: SlotPool, stream: int, data: bytes | bytearray, decode: Decode, dropped: int = 0
) -> None:
    """Publish ``data`` in a slot of ``pool`` for ``stream``, call ``decode(slot, buffer)``, then
    release the slot (the view let go first, as the collector does)."""
    slot = pool.take()
    assert slot is not None, "no free slot"
    pool.view(slot)[: len(data)] = data
    pool.publish(slot, ACTIVITY, stream, len(data), dropped)
    buffer = (pool.view(slot, len(data)), len(data), dropped)
    try:
        decode(slot, buffer)
    finally:
        del buffer
        pool.release(slot)


def remotely(stream: Any) -> Decode:
    """A ``decode`` for ``through_slot``: one request of ``stream`` (a ``RemoteStream``) for pool 0."""
    return lambda slot, buffer: stream.decode_slots(0, [(slot, buffer)])
