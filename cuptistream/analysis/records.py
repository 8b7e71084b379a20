"""Reading recordings for analysis: batches streamed one at a time, events decoded into light Structs.

The views (summary, trace export, plots) only need a few fields of each event. Decoding straight
into Structs that declare just those fields lets msgspec skip the rest, which is about twice as fast
as decoding the full schema (``cuptistream.events``); every tag of the schema has a Struct here so
any recording decodes. Field names match ``cuptistream.events``, so the full Structs (from Kafka or
JSON Lines) go through the same code.

Files are read frame by frame from disk (never a whole segment in memory), so memory stays bounded by
the largest batch, whatever the recording's size.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Union

import msgspec

from cuptistream import events as ev
from cuptistream.recording.codec import decode_expanding
from cuptistream.recording.framing import TornTail, scan_frames


class Light(msgspec.Struct, tag_field="type", kw_only=True, gc=False):
    """Base of the light Structs: a tagged event with only the fields the views read."""


class LKernel(Light, tag="kernel"):
    start: int
    end: int
    name: str
    device_id: int
    stream_id: int
    correlation_id: int
    graph_id: int = 0
    demangled_name: str | None = None  # recorded with ``demangle: true`` only


class LMemcpy(Light, tag="memcpy"):
    start: int
    end: int
    bytes: int
    copy_kind: str
    src_kind: str
    dst_kind: str
    device_id: int
    stream_id: int
    correlation_id: int


class LMemset(Light, tag="memset"):
    start: int
    end: int
    bytes: int
    memory_kind: str
    device_id: int
    stream_id: int
    correlation_id: int


class LGraphLaunch(Light, tag="graph_launch"):
    start: int
    end: int
    graph_id: int
    device_id: int
    stream_id: int
    correlation_id: int


class LApiCall(Light, tag="api"):
    domain: str
    name: str
    start: int
    end: int
    thread_id: int
    correlation_id: int


class LNvtxRange(Light, tag="nvtx_range"):
    name: str
    start: int
    end: int
    thread_id: int
    domain: str = ""


class LNvtxMarker(Light, tag="nvtx_marker"):
    name: str
    timestamp: int
    thread_id: int
    domain: str = ""


class LPcSample(msgspec.Struct, kw_only=True, gc=False):
    function_name: str
    stalls: dict[str, int]


class LPcSampleBatch(Light, tag="pc_samples"):
    timestamp: int
    device_id: int
    samples: list[LPcSample]
    total_samples: int
    dropped_samples: int = 0


class LSassRecord(msgspec.Struct, kw_only=True, gc=False):
    function_name: str
    values: dict[str, list[int]]


class LSassMetricBatch(Light, tag="sass_metrics"):
    timestamp: int
    device_id: int
    records: list[LSassRecord]


class LLoss(Light, tag="loss"):
    stage: str
    reason: str
    count: int
    since: int  # Unix-epoch ns
    until: int  # Unix-epoch ns
    unit: str = "events"


class LCuptiYield(Light, tag="cupti_yield"):
    tool: str
    start: int
    end: int
    missed: list[str]
    standby: list[str] = []


class LError(Light, tag="error"):
    severity: str
    origin: str
    message: str
    timestamp: int


class LHistogram(msgspec.Struct, kw_only=True, gc=False):
    min: int = 0
    max: int = 0


class LActivityStats(Light, tag="activity_stats"):
    interval_start: int
    interval_end: int
    device_id: int
    category: str
    name: str
    count: int
    total_ns: int
    durations: LHistogram
    traced_ns: int
    estimated: bool = False
    estimated_count: int = 0
    estimated_total_ns: int = 0
    bytes: int = 0
    estimated_bytes: int = 0


class LGpuStats(Light, tag="gpu_stats"):
    interval_start: int
    interval_end: int
    device_id: int
    traced_ns: int
    busy_ns: int
    busy_fraction: float
    kernel_ns: int
    nccl_ns: int
    estimated: bool = False


class LPmSamples(Light, tag="pm_samples"):
    device_id: int
    chip: str
    metrics: list[str]
    starts: list[int]
    ends: list[int]
    values: list[list[float | None]]  # JSON carries NaN (a sample CUPTI could not evaluate) as null


class LPmStats(Light, tag="pm_stats"):
    interval_start: int
    interval_end: int
    device_id: int
    samples: int
    metrics: list[str]
    mean: list[float | None]
    p95: list[float | None]


class LPmKernelStats(Light, tag="pm_kernel_stats"):
    interval_start: int
    interval_end: int
    device_id: int
    name: str
    kernel_ns: int
    covered_ns: int
    samples: int
    metrics: list[str]
    mean: list[float | None]
    own_share: float


class LKernelMetrics(Light, tag="kernel_metrics"):
    start: int
    end: int
    device_id: int
    metrics: list[str]
    passes: int
    names: list[str]
    launches: list[int]
    values: list[list[float | None]]
    not_profiled: int = 0


_READ = {
    LKernel, LMemcpy, LMemset, LGraphLaunch, LApiCall, LNvtxRange, LNvtxMarker, LPcSampleBatch,
    LSassMetricBatch, LLoss, LError, LCuptiYield, LActivityStats, LGpuStats, LPmSamples, LPmStats,
    LPmKernelStats, LKernelMetrics,
    ev.StackTable, ev.StackChanges, ev.StackStats,
}  # fmt: skip
_known = {cls.__struct_config__.tag for cls in _READ}
# Every other family decodes to an empty Struct: counted by type, fields skipped.
_OTHER: dict[str, type[msgspec.Struct]] = {
    tag: msgspec.defstruct(f"L_{tag}", [], bases=(Light,), tag=tag, kw_only=True)
    for tag in ev.EVENT_TYPES
    if tag not in _known
}
LightEvent = Union[tuple(sorted(_READ, key=lambda c: str(c.__struct_config__.tag))) + tuple(_OTHER.values())]  # type: ignore[valid-type]  # noqa: UP007
_light_events = msgspec.msgpack.Decoder(list[LightEvent])  # type: ignore[valid-type]


def tag_of(event: object) -> str:
    """The ``type`` tag of a light or full event."""
    return str(type(event).__struct_config__.tag)  # type: ignore[attr-defined]


class FamilyKey:
    """A family's stand-in in the summary's key column: never equal to an API name (a ``str``)."""

    __slots__ = ("tag",)

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __repr__(self) -> str:
        return f"FamilyKey({self.tag!r})"


FAMILY_KEY: dict[str, FamilyKey] = {tag: FamilyKey(tag) for tag in ev.EVENT_TYPES}


# The summary's Structs. Each has ``summary_key`` (an API call's name; for any other event its
# family's ``FamilyKey``), ``start`` and ``end`` (0 where the family has none), so the summary reads
# those three columns of a whole batch with one C-level pass each, never looking at the classes.
# API calls carry no domain string (the largest share of the decoding cost; the summary derives the
# domain from the name, see ``summary_report.api_domain``).
class SApiCall(Light, tag="api"):
    summary_key: str = msgspec.field(name="name")
    start: int
    end: int

    @property
    def name(self) -> str:
        return self.summary_key


class SKernel(Light, tag="kernel"):
    summary_key: ClassVar[FamilyKey] = FAMILY_KEY["kernel"]
    start: int
    end: int
    name: str
    device_id: int
    stream_id: int
    demangled_name: str | None = None  # recorded with ``demangle: true`` only


def _summary_struct(light: type[msgspec.Struct]) -> type[msgspec.Struct]:
    """``light`` with the summary's class-level columns added (no fields change)."""
    tag = str(light.__struct_config__.tag)
    namespace: dict[str, Any] = {"summary_key": FAMILY_KEY[tag]}
    fields = light.__struct_fields__
    namespace.update({f: 0 for f in ("start", "end") if f not in fields})
    return type("S" + light.__name__.removeprefix("L"), (light,), namespace, tag=tag)


_SUMMARY_CLASSES: tuple[type[msgspec.Struct], ...] = (
    SApiCall,
    SKernel,
    *(_summary_struct(c) for c in LightEvent.__args__ if c.__struct_config__.tag not in ("kernel", "api")),  # type: ignore[attr-defined]
)
SUMMARY_TYPES = frozenset(_SUMMARY_CLASSES)
_lean_events = msgspec.msgpack.Decoder(list[Union[_SUMMARY_CLASSES]])  # type: ignore[valid-type]  # noqa: UP007


class _Envelope(msgspec.Struct, kw_only=True, gc=False):
    """A batch with its events left encoded, so they can be decoded into light Structs."""

    session_id: str
    resource: ev.Resource
    clock: ev.ClockSync
    events: msgspec.Raw


_envelope = msgspec.msgpack.Decoder(_Envelope)


@dataclass
class Part:
    """One batch as the views see it: who produced it, its clock offset, its events."""

    resource: ev.Resource
    offset_ns: int  # add to an event's CUPTI-clock time to get Unix-epoch ns
    events: Sequence[Any]  # light Structs, or full ones (Kafka, JSON Lines)


class Recording:
    """A recording to read, possibly several times: a file, a directory of segments, or a Kafka topic.

    ``torn_tails`` lists files whose last frame was incomplete (a writer killed mid-write); the
    complete frames before it were read.
    """

    def __init__(
        self, spec: str, *, lean: bool = False, decoder: msgspec.msgpack.Decoder[Any] | None = None
    ) -> None:
        self.spec = spec
        # lean: the summary's Structs; decoder: a view's own (it must decode every tag of the schema)
        self._events = decoder or (_lean_events if lean else _light_events)
        self.torn_tails: list[TornTail] = []
        if spec.startswith("kafka://"):
            from cuptistream.recording.kafka_reader import parse_url

            parse_url(spec)  # refuse a malformed URL before connecting
            self.files: list[Path] = []
        else:
            from cuptistream.recording.reader import read

            self.files = read(spec).files  # the reader's rules: suffixes, name order, one-line errors

    def parts(self) -> Iterator[Part]:
        self.torn_tails = []
        if self.spec.startswith("kafka://"):
            from cuptistream.recording.kafka_reader import iter_kafka_batches

            for batch in iter_kafka_batches(self.spec):
                yield Part(batch.resource, batch.clock.offset_ns, batch.events)
            return
        for path in self.files:
            if path.name.removesuffix(".tmp").endswith(".msgpack.zst"):
                yield from self._msgpack_file(path)
            else:
                yield from self._other_file(path)

    def _msgpack_file(self, path: Path) -> Iterator[Part]:
        try:
            handle = path.open("rb")
        except OSError as error:
            self.torn_tails.append(TornTail(str(path), 0, 0, f"cannot read: {error.strerror}"))
            return
        with handle:
            # The reader's rules: checksums checked, frame sizes bounded, damage reported and skipped.
            for frame in scan_frames(handle, str(path)):
                if isinstance(frame, TornTail):
                    self.torn_tails.append(frame)
                    continue
                try:
                    envelope = _envelope.decode(frame.payload)
                    events = decode_expanding(envelope.events, self._events)
                except (msgspec.DecodeError, msgspec.ValidationError) as error:
                    problem = f"not a cuptistream batch: {error}"
                    self.torn_tails.append(TornTail(str(path), frame.offset, frame.length, problem))
                    continue
                yield Part(envelope.resource, envelope.clock.offset_ns, events)

    def _other_file(self, path: Path) -> Iterator[Part]:
        # JSON Lines: the reader decodes full Structs (read whole, as JSON Lines files are small).
        from cuptistream.recording.reader import Reader, TornTailWarning

        reader = Reader([path])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TornTailWarning)
            for batch in reader.batches():
                yield Part(batch.resource, batch.clock.offset_ns, batch.events)
        self.torn_tails.extend(reader.torn_tails)
