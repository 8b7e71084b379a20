"""The stdout sink: every batch as JSON Lines (``cuptistream.recording.jsonl``) on standard output.

Meant for piping into ``jq`` or a log shipper. Each batch is written in one binary write and
flushed, in a worker thread so a slow reader of the pipe does not stall the other sinks.
A closed pipe (the reader went away) fails the write with ``DeliveryError``.
"""

from __future__ import annotations

import sys
from typing import BinaryIO

import trio

from cuptistream.config import SinkConfig
from cuptistream.plugin import DeliveryError, OutgoingBatch, Sink
from cuptistream.recording import jsonl


class StdoutSinkConfig(SinkConfig, kw_only=True):
    """No settings of its own; the queue and batch settings every sink has."""


class StdoutSink(Sink):
    config_type = StdoutSinkConfig

    def __init__(self, config: SinkConfig, stream: BinaryIO | None = None) -> None:
        super().__init__(config)
        self._stream = stream  # None: sys.stdout at write time (tests and the CLI may swap it)
        self.batches_written = 0
        self.bytes_written = 0

    async def write(self, batch: OutgoingBatch) -> None:
        written = await trio.to_thread.run_sync(self._write, batch)
        self.batches_written += 1
        self.bytes_written += written

    def _write(self, batch: OutgoingBatch) -> int:
        data = jsonl.encode_batch(batch.batch)  # decoding and encoding happen off the trio thread too
        stream = self._stream or sys.stdout.buffer
        try:
            stream.write(data)
            stream.flush()
        except (BrokenPipeError, ValueError) as error:  # ValueError: stdout was closed
            raise DeliveryError(f"{self.where()}: cannot write to stdout: {error}") from error
        return len(data)

    def stats(self) -> dict[str, int]:
        return {"batches_written": self.batches_written, "bytes_written": self.bytes_written}
