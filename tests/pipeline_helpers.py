"""A real Sink that keeps what it receives in memory, optionally slowly, for pipeline tests."""

from __future__ import annotations

import trio

from cuptistream.config import QueueConfig, SinkConfig
from cuptistream.events import Batch, Kernel, Loss
from cuptistream.plugin import OutgoingBatch, Sink
from cuptistream.recording.codec import decode_batch


class MemorySink(Sink):
    """Decodes and keeps every batch. ``delay`` seconds per write makes it a slow destination."""

    def __init__(self, name: str, delay: float = 0.0, queue: QueueConfig | None = None) -> None:
        super().__init__(SinkConfig(type="memory", name=name, queue=queue or QueueConfig()))
        self.delay = delay
        self.batches: list[Batch] = []
        self.closed = False

    async def write(self, batch: OutgoingBatch) -> None:
        if self.delay:
            await trio.sleep(self.delay)
        self.batches.append(decode_batch(batch.data))

    async def close(self) -> None:
        self.closed = True

    def kernels(self) -> list[Kernel]:
        return [e for b in self.batches for e in b.events if isinstance(e, Kernel)]

    def lost(self, stage: str) -> int:
        return sum(
            e.count for b in self.batches for e in b.events if isinstance(e, Loss) and e.stage == stage
        )
