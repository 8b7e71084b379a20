"""An in-memory Emitter for GPU workloads that drive a source directly (no pipeline)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from cuptistream.channel.messages import OpenStream
from cuptistream.channel.outlet import ActivityOutlet
from cuptistream.collector.inline import InlineOutlet
from cuptistream.events import Event
from cuptistream.plugin import Emitter
from cuptistream.recording.codec import Chunk, array_header, decode_events


class Collect(Emitter):
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.losses: list[tuple[str, str, int, str]] = []
        self.errors: list[tuple[str, str, str, int]] = []
        self._lock = threading.Lock()

    def emit(self, events: Sequence[Event]) -> None:
        with self._lock:
            self.events.extend(events)

    def emit_chunk(self, chunk: Chunk) -> None:
        self.emit(decode_events(array_header(chunk.count) + chunk.payload))

    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        self.losses.append((stage, reason, count, unit))

    def report_error(self, origin: str, message: str, severity: str = "error", result_code: int = 0) -> None:
        self.errors.append((origin, message, severity, result_code))

    def open_activity_stream(self, stream: OpenStream, buffer_size: int, buffers: int) -> ActivityOutlet:
        """Buffers decoded where they complete (no collector process): see ``InlineOutlet``."""
        return InlineOutlet(stream, buffer_size, buffers, self)
