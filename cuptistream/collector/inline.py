"""``InlineOutlet``: activity buffers decoded on the thread that completes them, in this process.

For tests and tools that drive a source directly with an in-memory emitter (no probe, no collector
process). It does the per-record work the probe never does, on CUPTI's thread: not for production.
"""

from __future__ import annotations

import os

from cuptistream.channel.messages import OpenStream
from cuptistream.channel.outlet import PoolOutlet
from cuptistream.channel.shm import SlotPool
from cuptistream.collector.decoding import DecodeStream
from cuptistream.plugin import Emitter


class InlineOutlet(PoolOutlet):
    def __init__(self, stream: OpenStream, buffer_size: int, buffers: int, emitter: Emitter) -> None:
        super().__init__(SlotPool.create(stream.source, buffer_size, buffers))
        self.decoder = DecodeStream(stream, os.getpid(), emitter)

    def complete(self, address: int, valid: int, dropped: int = 0) -> None:
        slot = self.pool.slot_of(address)
        if slot is None:
            return
        try:
            self.decoder.decode(self.pool.view(slot, valid), valid, dropped)
        finally:
            self.pool.release(slot)

    def close(self) -> None:
        self.decoder.close()
