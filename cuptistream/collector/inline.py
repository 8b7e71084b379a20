"""``InlineOutlet``: activity buffers decoded on the thread that completes them, in this process.

For tests and tools that drive a source directly with an in-memory emitter (no probe, no collector
process). It does the per-record work the probe never does, on CUPTI's thread: not for production.
"""

from __future__ import annotations

import os
import time

from cuptistream.channel.messages import OpenStream
from cuptistream.channel.shm import SlotPool
from cuptistream.collector.decoding import DecodeStream
from cuptistream.component import ActivityOutlet, Emitter


class InlineOutlet(ActivityOutlet):
    def __init__(self, stream: OpenStream, buffer_size: int, buffers: int, emitter: Emitter) -> None:
        self.pool = SlotPool.create(stream.source, buffer_size, buffers)
        self.slot_size = self.pool.slot_size
        self.decoder = DecodeStream(stream, os.getpid(), emitter)

    def take(self) -> int | None:
        slot = self.pool.take()
        return None if slot is None else self.pool.address(slot)

    def owns(self, address: int) -> bool:
        return self.pool.slot_of(address) is not None

    def complete(self, address: int, valid: int, dropped: int = 0) -> None:
        slot = self.pool.slot_of(address)
        if slot is None:
            return
        try:
            self.decoder.decode(self.pool.view(slot, valid), valid, dropped)
        finally:
            self.pool.release(slot)

    def give_back(self, address: int) -> None:
        slot = self.pool.slot_of(address)
        if slot is not None:
            self.pool.release(slot)

    def write(self, data: bytes, dropped: int = 0, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while (address := self.take()) is None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        slot = self.pool.slot_of(address)
        assert slot is not None
        self.pool.view(slot, len(data))[:] = data
        self.complete(address, len(data), dropped)
        return True

    def wait_consumed(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        self.decoder.close()
