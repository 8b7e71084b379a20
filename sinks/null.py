"""The null sink: counts what it is given and discards it. For benchmarks and dry runs."""

from __future__ import annotations

from cuptistream.config import SinkConfig
from cuptistream.plugin import OutgoingBatch, Sink


class NullSinkConfig(SinkConfig, kw_only=True):
    """No settings of its own."""


class NullSink(Sink):
    config_type = NullSinkConfig

    def __init__(self, config: SinkConfig) -> None:
        super().__init__(config)
        self.batches = 0
        self.events = 0
        self.bytes = 0

    @property
    def accepts_columns(self) -> bool:
        return True

    async def write(self, batch: OutgoingBatch) -> None:
        self.batches += 1
        self.events += batch.event_count
        self.bytes += batch.nbytes

    def stats(self) -> dict[str, int]:
        return {"batches": self.batches, "events": self.events, "bytes": self.bytes}
