"""The plug-in contract: everything a source or a sink, ours or a third party's, imports.

- ``Source`` (produces events through an ``Emitter``) and ``Sink`` (delivers ``OutgoingBatch``es);
  ``OnDemand``: what a source implements to open full-trace windows for ``cuptistream trace``;
- the event schema (``events``: one Struct per event type; ``Batch``, ``Event``);
- the config bases whose fields are a component's YAML keys (``SourceConfig``, ``SinkConfig``,
  ``Size``, ``Duration``, ``RetryConfig``) and secrets from the environment (``secret_from_env``);
- the errors (``DeliveryError``, ``RetryableError``, ``SinkUnavailableError``, ``PermanentSinkError``,
  ``ConfigError``, ``UserError``) and the retry helper (``call_with_retry``) a sink may use.

Every component subclasses ``Source`` or ``Sink``, declares its config Struct in ``config_type`` and
registers under the entry-point group ``cuptistream.sources`` or ``cuptistream.sinks``.
``docs/architecture.md`` is the whole contract; ``tests/test_plugin_contract.py`` pins ``__all__``.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from cuptistream import events
from cuptistream.config.model import ComponentConfig, Duration, RetryConfig, SinkConfig, Size, SourceConfig
from cuptistream.errors import (
    ConfigError,
    DeliveryError,
    PermanentSinkError,
    RetriesExhausted,
    RetryableError,
    SinkUnavailableError,
    UserError,
)
from cuptistream.events import Batch, Event, Resource
from cuptistream.recording.codec import decode_batch, encode_chunk

__all__ = [
    "Batch",
    "ComponentConfig",
    "ConfigError",
    "DeliveryError",
    "Duration",
    "Emitter",
    "Event",
    "OnDemand",
    "OutgoingBatch",
    "PermanentSinkError",
    "RetriesExhausted",
    "RetryConfig",
    "RetryableError",
    "Sink",
    "SinkConfig",
    "SinkUnavailableError",
    "Size",
    "Source",
    "SourceConfig",
    "UserError",
    "call_with_retry",
    "events",
    "secret_from_env",
    "sink_where",
]

if TYPE_CHECKING:
    import threading

    from cuptistream.channel.messages import GpmAsk, OpenStream, SamplerGrant
    from cuptistream.channel.outlet import ActivityOutlet
    from cuptistream.delivery.retry import call_with_retry
    from cuptistream.recording.codec import Chunk


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

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait up to ``timeout`` s until what was emitted before this call is handed on; False if
        it is not by then. Where events are handed on as they are emitted, there is nothing to wait for."""
        return True

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


@runtime_checkable
class OnDemand(Protocol):
    """A source that can trace a full window when asked (``cuptistream trace --for 30s``).

    The probe calls ``open_window`` on its control thread when the collector forwards a request;
    sources without the method are not asked. Return at once (never wait for CUPTI or the program):
    open the window now, or arrange for it to open, and return how many windows will be reported,
    one per activity stream traced. For each, send a ``TraceSpan`` with ``on_demand=True`` and this
    ``request`` through the stream's outlet (``ActivityOutlet.send_trace_span``): when it opens
    (``end`` 0) and when it closes, ``seconds`` later, after the window's buffers were handed over.
    The collector waits for exactly that many closes. Raise (any exception, one-line message) to
    refuse: the user sees the message. A window asked for on demand is charged to no budget.
    ``metrics`` (``cuptistream trace --metrics``; passed only when given): measure each kernel of
    the window with these metrics too (``KernelMetrics`` events), or refuse.
    """

    def open_window(self, seconds: float, request: int, metrics: str = "") -> int: ...


class DeviceGrants(Protocol):
    """What a source that owns a device-wide resource (PM sampling's counters) is handed by its
    probe (``use_grants``): the collector decides which process on the node uses each device."""

    def uuid_of(self, device: int) -> str:
        """The UUID of CUDA ordinal ``device`` in this process ("": not known)."""
        ...

    def wait(
        self, uuid: str, source: str, stopping: threading.Event, gpm: GpmAsk | None = None, ask: bool = True
    ) -> SamplerGrant | None:
        """Ask for ``uuid`` (``gpm``: how the source would sample it through NVML, which the
        collector can do in its place) and wait for the grant, or for the collector's word that it
        samples the device itself (``SamplerGrant.collector``); ``ask`` False: wait on after that
        word. None: ``stopping`` was set first."""
        ...

    def release(self, uuid: str, source: str, last_end: int) -> None:
        """``source`` no longer uses or waits for ``uuid``."""
        ...


class OutgoingBatch:
    """One batch on its way to a sink: the msgpack encoding plus what sinks need to route it.

    The encoding is ``data`` (bytes), or ``parts`` whose concatenation it is: the lane hands over
    the header and the chunks' payloads as they lie, and ``data`` joins them the first time a sink
    asks (the file sink compresses the parts without joining them)."""

    def __init__(
        self,
        data: bytes | None = None,
        seq: int = 0,
        event_count: int = 0,
        first_chunk_ns: int = 0,  # monotonic ns when its first events entered the pipeline
        resource: Resource | None = None,  # the envelope's: which process the events came from
        *,
        parts: Sequence[bytes | memoryview] | None = None,
    ) -> None:
        if data is not None and parts is None:
            self.parts: Sequence[bytes | memoryview] = (data,)
        elif data is None and parts is not None:
            self.parts = tuple(parts)
        else:
            raise ValueError("OutgoingBatch takes exactly one of data and parts")
        self._data = data
        self.seq, self.event_count = seq, event_count
        self.first_chunk_ns, self.resource = first_chunk_ns, resource

    @property
    def data(self) -> bytes:
        """The msgpack of a Batch, in one piece."""
        if self._data is None:
            self._data = b"".join(self.parts)
        return self._data

    @property
    def nbytes(self) -> int:
        return sum(len(part) for part in self.parts)

    @cached_property
    def batch(self) -> Batch:
        """The decoded Batch, for sinks that map events one by one (decoded once, on demand)."""
        return decode_batch(self.data)

    def __repr__(self) -> str:
        return f"OutgoingBatch(seq={self.seq}, event_count={self.event_count}, nbytes={self.nbytes})"


class Sink(abc.ABC):
    """Delivers batches somewhere. All methods run in the pipeline's trio thread.

    ``open`` checks the destination and raises ``SinkUnavailableError`` (cannot reach or use it) or
    ``ConfigError`` (a setting or a secret's environment variable is wrong) with a one-line message
    that starts with ``self.where(key)``. ``write`` delivers one batch, or raises ``RetryableError``
    (this attempt failed, a later one may not) or ``DeliveryError`` (lost, counted as such). Blocking
    I/O belongs in ``trio.to_thread.run_sync`` so other sinks keep moving.

    The lane applies the shared ``config.retry`` and ``config.timeout`` settings to ``write``: each
    attempt is cancelled after ``timeout`` and a ``RetryableError`` (or the timeout) is retried with
    the shared backoff until ``retry.max_elapsed``, so a sink needs no retry code of its own. A sink
    that retries inside ``write`` itself (partial successes, a spool) sets ``retries_itself``.
    ``docs/architecture.md`` is the whole contract.
    """

    config_type: ClassVar[type[SinkConfig]] = SinkConfig
    # True: ``write`` may run before ``connect`` has succeeded (the sink holds or spools what it
    # gets meanwhile, like the Kafka sink). False: the lane queues until ``connect`` succeeds.
    writes_while_connecting: ClassVar[bool] = False
    # True: ``write`` applies ``retry`` and ``timeout`` itself (``call_with_retry``), so the lane calls
    # it once per batch. False: the lane retries it (see above).
    retries_itself: ClassVar[bool] = False

    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    @property
    def accepts_columns(self) -> bool:
        """True: the sink stores or drops batches as they are, so the hot kinds may reach it as
        ``events.Columns`` elements (one per up to 8192 records; every reader expands them). A sink
        that ships batches to other programs, or maps events one by one, keeps the default: one
        element per event, the encoding its consumers read."""
        return False

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

    def acknowledged_events(self) -> int | None:
        """Events a receiver has acknowledged, cumulative, for a sink whose ``write`` returns before
        that (it holds, then sends, as Kafka's does). None, the default: ``write`` returns only once
        the batch is delivered, so everything it accepted and did not lose later counts as delivered."""
        return None

    def spooled_events(self) -> int:
        """Events accepted by ``write`` that wait in the sink's own spool now (on its disk, for a
        later send or the next run): neither delivered nor lost. Reported as ``events_spooled``;
        never counted as delivered."""
        return 0

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


def __getattr__(name: str) -> object:
    # The retry helper runs on trio: imported when a sink asks for it, not with the contract.
    if name == "call_with_retry":
        from cuptistream.delivery.retry import call_with_retry

        return call_with_retry
    raise AttributeError(f"module 'cuptistream.plugin' has no attribute {name!r}")
