"""The two component protocols: Source (produces events) and Sink (delivers batches).

Every source and sink, ours or a third party's, subclasses one of these, declares its config Struct
in ``config_type`` and registers under the entry-point group ``cuptistream.sources`` or
``cuptistream.sinks``. The config Struct's fields are the keys of the component's YAML entry.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

from cuptistream.codec import decode_batch
from cuptistream.config import SinkConfig, SourceConfig
from cuptistream.events import Batch, Event

if TYPE_CHECKING:
    from cuptistream.codec import Chunk


class Emitter(abc.ABC):
    """What a source hands its events to. Thread-safe; callable from any thread.

    ``emit`` never blocks unless the pipeline's ``full_policy`` is ``block``; sources running on
    CUPTI threads must not choose ``block`` for themselves, and the pipeline counts every drop.
    """

    @abc.abstractmethod
    def emit(self, events: Sequence[Event]) -> None: ...

    @abc.abstractmethod
    def emit_chunk(self, chunk: Chunk) -> None: ...

    @abc.abstractmethod
    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        """Count records lost before they became events (e.g. CUPTI's own drops)."""

    @abc.abstractmethod
    def report_error(self, origin: str, message: str, severity: str = "error", result_code: int = 0) -> None:
        """Emit an Error event. Never raises."""


class Source(abc.ABC):
    """Collects data inside the process and emits events.

    Lifecycle: ``start()`` on the thread that owns the session, then ``flush()`` any number of times,
    then ``stop()``, which must emit everything still held before returning. A source that fails
    raises from ``start()``; the session disables it, emits an Error event and carries on.
    """

    config_type: ClassVar[type[SourceConfig]] = SourceConfig
    # Set by a CUPTI source in start(): returns the CUPTI clock in ns (cuptiGetTimestamp), so the
    # session can record the offset to the Unix epoch in every batch envelope.
    clock: Callable[[], int] | None = None

    def __init__(self, config: SourceConfig, emitter: Emitter) -> None:
        self.config = config
        self.emitter = emitter

    @property
    def name(self) -> str:
        return self.config.name or self.config.type

    @abc.abstractmethod
    def start(self) -> None: ...

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Hand over what is buffered now."""

    @abc.abstractmethod
    def stop(self) -> None: ...


@dataclass
class OutgoingBatch:
    """One batch on its way to a sink: the msgpack encoding plus what sinks need to route it."""

    data: bytes  # msgpack of a Batch; the file sink writes it as is
    seq: int
    event_count: int
    first_chunk_ns: int = 0  # monotonic ns when its first events entered the pipeline
    _extra: dict[str, object] = field(default_factory=dict, repr=False)

    @cached_property
    def batch(self) -> Batch:
        """The decoded Batch, for sinks that map events one by one (decoded once, on demand)."""
        return decode_batch(self.data)


class Sink(abc.ABC):
    """Delivers batches somewhere. All methods run in the pipeline's trio thread.

    ``open`` checks the destination and raises ``SinkUnavailableError`` with a one-line message if
    it cannot be used. ``write`` delivers one batch, or raises ``DeliveryError`` (counted as lost).
    Blocking I/O belongs in ``trio.to_thread.run_sync`` so other sinks keep moving.
    """

    config_type: ClassVar[type[SinkConfig]] = SinkConfig

    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name or self.config.type

    async def open(self) -> None:  # noqa: B027 - optional hook
        pass

    @abc.abstractmethod
    async def write(self, batch: OutgoingBatch) -> None: ...

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release. Called once, after the last write, within the shutdown deadline."""

    def stats(self) -> dict[str, int]:
        """Sink-specific counters (e.g. acked, retried, spooled) folded into self-stats."""
        return {}


class DeliveryError(Exception):
    """A batch could not be delivered and will not be retried by the pipeline."""
