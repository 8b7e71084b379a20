"""The two component protocols: Source (produces events) and Sink (delivers batches).

Every source and sink, ours or a third party's, subclasses one of these, declares its config Struct
in ``config_type`` and registers under the entry-point group ``cuptistream.sources`` or
``cuptistream.sinks``. The config Struct's fields are the keys of the component's YAML entry.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

from cuptistream.codec import decode_batch, encode_chunk
from cuptistream.config import SinkConfig, SourceConfig
from cuptistream.errors import ConfigError
from cuptistream.events import Batch, Event, Resource

if TYPE_CHECKING:
    from cuptistream.channel.messages import OpenStream
    from cuptistream.codec import Chunk


class ActivityOutlet(abc.ABC):
    """Where a source hands raw CUPTI activity buffers: slots of shared memory the collector decodes.

    ``take`` and ``complete`` do O(1) work and never wait, so they are safe on CUPTI's threads.
    """

    slot_size: int

    @abc.abstractmethod
    def take(self) -> int | None:
        """The address of a free buffer of ``slot_size`` bytes, or None when all are in use."""

    @abc.abstractmethod
    def complete(self, address: int, valid: int, dropped: int = 0) -> None:
        """Hand the buffer at ``address`` (``valid`` bytes of records) to the collector."""

    @abc.abstractmethod
    def give_back(self, address: int) -> None:
        """Return a buffer that holds nothing worth decoding."""

    def owns(self, address: int) -> bool:
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """The source is done: no buffer is taken or completed after this."""

    def write(self, data: bytes, dropped: int = 0, timeout: float = 30.0) -> bool:
        """Copy ``data`` into a buffer and hand it over, waiting up to ``timeout`` for a free one
        (for sources that are not on CUPTI's threads, e.g. replay). False: no buffer came free."""
        raise NotImplementedError


class Emitter(abc.ABC):
    """What a source hands its events to. Thread-safe; callable from any thread.

    ``emit`` never blocks unless the pipeline's ``full_policy`` is ``block``; sources running on
    CUPTI threads must not choose ``block`` for themselves, and the pipeline counts every drop.
    """

    def emit(self, events: Sequence[Event]) -> None:
        """Encode ``events`` once, on this thread, and hand them over as one chunk."""
        if events:
            self.emit_chunk(encode_chunk(events))

    @abc.abstractmethod
    def emit_chunk(self, chunk: Chunk) -> None: ...

    @abc.abstractmethod
    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        """Count records lost before they became events (e.g. CUPTI's own drops)."""

    @abc.abstractmethod
    def report_error(self, origin: str, message: str, severity: str = "error", result_code: int = 0) -> None:
        """Emit an Error event. Never raises."""

    def open_activity_stream(self, stream: OpenStream, buffer_size: int, buffers: int) -> ActivityOutlet:
        """Raw activity buffers for the collector to decode (``buffers`` x ``buffer_size`` bytes of
        shared memory). Only the probe's emitter has one; raises ``UserError`` elsewhere."""
        from cuptistream.errors import UserError

        raise UserError("this emitter takes events only; raw activity buffers need the probe's channel")


class Source(abc.ABC):
    """Collects data inside the process and emits events.

    Lifecycle: ``start()`` on the thread that owns the session, then ``flush()`` any number of times,
    then ``stop()``, which must emit everything still held before returning. A source that fails
    raises from ``start()``; the session disables it, emits an Error event and carries on.
    """

    config_type: ClassVar[type[SourceConfig]] = SourceConfig
    # False for sources that do not trace CUDA (replay, synthetic): their probe need not wait for
    # the process to initialize CUDA (``probe.start: auto``).
    traces_cuda: ClassVar[bool] = True
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
    resource: Resource | None = None  # the envelope's: which process the events came from
    _extra: dict[str, object] = field(default_factory=dict, repr=False)

    @cached_property
    def batch(self) -> Batch:
        """The decoded Batch, for sinks that map events one by one (decoded once, on demand)."""
        return decode_batch(self.data)


class Sink(abc.ABC):
    """Delivers batches somewhere. All methods run in the pipeline's trio thread.

    ``open`` checks the destination and raises ``SinkUnavailableError`` (cannot reach or use it) or
    ``ConfigError`` (a setting or a secret's environment variable is wrong) with a one-line message
    that starts with ``self.where(key)``. ``write`` delivers one batch, or raises ``DeliveryError``
    (counted as lost). Blocking I/O belongs in ``trio.to_thread.run_sync`` so other sinks keep moving.
    The shared ``config.retry`` and ``config.timeout`` settings apply to every attempt a sink makes
    (``cuptistream.retry``). ``docs/architecture.md`` is the whole contract.
    """

    config_type: ClassVar[type[SinkConfig]] = SinkConfig
    # True: ``write`` may run before ``connect`` has succeeded (the sink holds or spools what it
    # gets meanwhile, like the Kafka sink). False: the lane queues until ``connect`` succeeds.
    writes_while_connecting: ClassVar[bool] = False

    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name or self.config.type

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Local checks and set-up only (settings, secrets, directories): it runs before the program
        starts, and its error stops the run. Reaching the destination belongs in ``connect``."""

    async def connect(self) -> None:  # noqa: B027 - optional hook
        """Reach the destination (TCP, TLS, login, metadata). Runs in the background after the program
        started (``--require-healthy``: before), cancelled after ``connect_timeout`` and retried with
        the shared backoff until it returns. Raise ``SinkUnavailableError`` for a failure that may pass
        (retried) or ``PermanentSinkError`` for one no retry fixes (the sink stops, its data is counted
        lost under the error's ``reason``); one line, starting with ``self.where()``."""

    @abc.abstractmethod
    async def write(self, batch: OutgoingBatch) -> None: ...

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release. Called once, after the last write, within the shutdown deadline."""

    def stats(self) -> dict[str, int]:
        """Sink-specific cumulative counters (e.g. acked, retried, spooled). The pipeline copies them
        into ``SelfStats`` (``stages["sink:<name>"].counters``) and the shutdown report."""
        return {}

    def delivery_losses(self) -> dict[str, int]:
        """Events lost after ``write`` returned (accepted, then not delivered), cumulative, by reason
        (e.g. Kafka's ``retries_exhausted``). The pipeline turns their growth into ``Loss`` events
        (stage ``sink:<name>``), adds them to the stage's ``events_dropped`` (and takes them out of
        its ``events_out``) and to the shutdown report. A loss raised from ``write`` as
        ``DeliveryError`` is counted by the pipeline already: do not count it here too."""
        return {}

    def where(self, key: str = "") -> str:
        """How every message about this sink starts: ``sinks[<name>]`` or ``sinks[<name>].<key>``."""
        return sink_where(self.name, key)


def sink_where(name: str, key: str = "") -> str:
    """``sinks[<name>]`` or ``sinks[<name>].<key>``: the one prefix of sink errors and log lines."""
    return f"sinks[{name}]" + (f".{key}" if key else "")


def secret_from_env(sink: str, key: str, variable: str) -> str:
    """The value of the environment variable a sink's ``key`` names (a password, a header). Raises
    ``ConfigError`` (one line naming the key and the variable, never a value) if it is not set."""
    value = os.environ.get(variable)
    if value is None:
        raise ConfigError(
            f"{sink_where(sink, key)}: environment variable {variable} is not set; export the secret there"
        )
    return value


class DeliveryError(Exception):
    """A batch could not be delivered and will not be retried by the pipeline. The message starts
    with ``Sink.where()``.

    ``lost``: which of the batch's events were lost, by reason (e.g. ``{"delivery_failed": 120}``);
    the rest count as delivered. None (the default): all of them, as ``delivery_failed``.
    """

    def __init__(self, message: str, lost: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.lost = lost
