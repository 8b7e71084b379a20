"""The messages on the probe↔collector socket (msgpack, one per SOCK_SEQPACKET datagram).

Every message is small; bulk data travels in shared-memory slots (``shm``). ``Hello`` and
``OpenPool`` carry file descriptors (the memfds) as ancillary data, one per pool, in order.
"""

from __future__ import annotations

from typing import Union

import msgspec

from cuptistream.events import ClockSync, DeviceInfo, Resource


class Message(msgspec.Struct, tag=True, kw_only=True):
    pass


class PoolSpec(msgspec.Struct, kw_only=True):
    pool: int  # the probe's pool number, used by ``Ready`` and stream definitions
    slot_size: int
    slots: int


class Hello(Message, tag="hello"):
    """First message of a connection; one fd per ``pools`` entry rides along."""

    protocol: int
    session_id: str
    resource: Resource
    pools: list[PoolSpec]
    clock: ClockSync | None = None
    devices: list[DeviceInfo] = []  # every GPU visible to the process, by CUDA ordinal


class OpenPool(Message, tag="open_pool"):
    """A pool created after the hello; its fd rides along."""

    spec: PoolSpec


class OpenStream(Message, tag="open_stream"):
    """A source of raw activity buffers: what the collector needs to decode them."""

    stream: int
    source: str
    device: str = ""
    cupti_version: int = 0
    struct_sizes: dict[int, int] = {}  # CUpti_ActivityKind -> record size
    strings: dict[int, str] | None = None  # pointer -> text (replay); None: read the probe's memory
    demangle: bool = False
    capture: str = ""  # also write the raw buffers to this capture file (collector side)
    clock: ClockSync | None = None  # CUPTI's clock next to the Unix clock when the source started
    # "all": forward every record; "on_demand": only those inside on-demand TraceSpans (statistics
    # still see every record).
    records: str = "all"
    # The probe samples the stacks of the threads that launch this stream's work (``stacks``): only
    # then does the collector keep its API records and GPU work for the stack statistics.
    stacks: bool = False


class Ready(Message, tag="ready"):
    """Slots of ``pool`` were published; the collector drains every READY slot in order."""

    pool: int


class LossReport(Message, tag="loss"):
    stage: str
    reason: str
    count: int
    unit: str = "events"


class ErrorReport(Message, tag="error"):
    origin: str
    message: str
    severity: str = "error"
    result_code: int = 0
    timestamp: int = 0  # CUPTI clock ns (the event clock)


class ClockReading(Message, tag="clock"):
    clock: ClockSync


class Goodbye(Message, tag="goodbye"):
    """The probe stopped cleanly; everything it published before this is READY."""

    stats: dict[str, int] = {}


class TraceSpan(Message, tag="trace_span"):
    """Probe -> collector: a span in which ``stream`` traced ``kinds``: sent when a window opens
    (``end`` 0) and again when it closes, after the window's buffers were published. The collector's
    statistics use the spans as their coverage; ``on_demand`` windows come from ``cuptistream trace``."""

    stream: int
    window: int  # the probe's window number (per stream)
    start: int  # CUPTI clock ns
    end: int = 0  # 0: still open
    kinds: list[str] = []  # activity kind names traced in the span
    on_demand: bool = False
    request: int = 0  # the collector's OpenWindow.request this window answers
    # CUPTI was attached anew for this window (``between_windows: detach``): its correlation ids do
    # not count the calls made since the last window, so no call rate spans that gap.
    fresh: bool = False
    # Sent between the two: the window's kinds went off at ``end`` and its last records follow in a
    # forced flush, which dates the kernels still running at its own time. The close comes after.
    closing: bool = False


class OpenWindow(Message, tag="open_window"):
    """Collector -> probe: trace a full window of ``seconds`` now (``cuptistream trace --for``),
    charged to no budget; with ``metrics`` (``--metrics``), measure its kernels with them too."""

    request: int
    seconds: float
    metrics: str = ""  # a metric set or metric names separated by commas; "": none


class WindowRecords(Message, tag="window_records"):
    """Collector -> probe: what the collector decoded from one closed window: records per event type
    (``kernel``, ``api``, ...) and the kernels' summed GPU time. The governor prices windows with it."""

    stream: int
    window: int
    records: dict[str, int] = {}
    kernel_ns: int = 0


class WindowAnswer(Message, tag="window_answer"):
    """Probe -> collector: the answer to ``OpenWindow`` ``request``, sent once every source was asked.
    ``windows`` spans were opened (each gets a ``TraceSpan`` with this ``request``, open and then
    closed); ``opened`` names the sources that opened them, ``refused`` the sources that can trace on
    demand but would not now (name -> one-line reason). ``windows`` 0: nothing will be traced."""

    request: int
    windows: int = 0
    opened: list[str] = []
    refused: dict[str, str] = {}


class GpmAsk(msgspec.Struct, kw_only=True):
    """How a source would sample a device through NVML's GPM: what the collector needs to sample it
    in the source's place."""

    interval_ns: int
    metrics: list[str]  # ``gpm__...`` names
    decode_period_ns: int


class SamplerAsk(Message, tag="sampler_ask"):
    """Probe -> collector: ``source`` would sample the counters of device ``uuid`` (one sampler per
    device on the node: the collector grants it, ``SamplerGrant``). ``ask`` False: it no longer
    samples or waits (stopped; sent after it disabled the counters), ``last_end`` its last sample's
    end (CUPTI clock ns; 0: none). ``holds``: sent again to a new collector (a reconnect) by the
    source that samples the device now. ``gpm``: the source would sample through NVML, which the
    collector can do itself (None: through CUPTI, in the probe's CUDA context)."""

    uuid: str
    source: str
    ask: bool = True
    last_end: int = 0
    holds: bool = False
    gpm: GpmAsk | None = None


class SamplerGrant(Message, tag="sampler_grant"):
    """Collector -> probe: ``source`` samples device ``uuid`` from now on, until it stops. Taken
    over from ``previous`` (a pid; 0: nobody sampled the device before), whose last sample ended at
    ``since`` (CUPTI clock ns; 0: not known, it left without saying). ``collector``: the collector
    samples the device itself (NVML's GPM); the source samples nothing and waits for a grant of its
    own, which comes only if the collector stops sampling while the source still runs."""

    uuid: str
    source: str
    previous: int = 0
    since: int = 0
    collector: bool = False


AnyMessage = Union[  # noqa: UP007
    Hello,
    OpenPool,
    OpenStream,
    Ready,
    LossReport,
    ErrorReport,
    ClockReading,
    Goodbye,
    TraceSpan,
    OpenWindow,
    WindowRecords,
    WindowAnswer,
    SamplerAsk,
    SamplerGrant,
]

PROTOCOL = 1
MAX_MESSAGE = 256 * 1024

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AnyMessage)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> AnyMessage:
    """Raises ``msgspec.DecodeError``/``ValidationError`` on a malformed message."""
    return _decoder.decode(data)
