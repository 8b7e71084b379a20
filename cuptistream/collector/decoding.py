"""One decode stream per activity source of a probe: raw CUPTI buffers in, encoded events out.

Decoding is bulk (``cuptistream.collector.buffer_decoder``: one walk, numpy gathers, and for the hot kinds
msgpack written column by column, ``cuptistream.cupti.columnar``) and happens here, in the
collector, so the observed program never pays for it. Each stream keeps its own record layouts,
name cache and open NVTX ranges, and its statistics (``cuptistream.statistics``): the decoder hands
every gathered array to ``_observe``, which folds kernels, copies and memsets into the stream's
``Accumulator`` and counts what each open trace window decoded (``WindowRecords``). Where the probe
samples stacks, the connection hands the process's stack events over too (``stack_events``), and the
statistics fold GPU time per launching stack as well (``statistics.stack_fold``). Where a probe
of the collector samples a device's counters, every stream is handed the samples (``pm_samples``),
and the statistics attribute them to the stream's kernels (``statistics.pm_attribution``).
"""

from __future__ import annotations

import ctypes
import itertools
import re
from collections import Counter
from collections.abc import Callable

import msgspec
import numpy as np

from cuptistream.channel.messages import OpenStream, TraceSpan, WindowRecords
from cuptistream.collector.buffer_decoder import Decoder
from cuptistream.collector.names import ProcessNames
from cuptistream.config.model import StatisticsConfig
from cuptistream.cupti import capture
from cuptistream.cupti.names import TableNames
from cuptistream.cupti.records import LayoutError, RecordLayouts, SizeLearner
from cuptistream.events import AnyEvent, Event, PmSamples
from cuptistream.plugin import Emitter
from cuptistream.recording.codec import array_header
from cuptistream.statistics import Accumulator
from cuptistream.statistics.stack_fold import StackFold

_events = msgspec.msgpack.Decoder(list[AnyEvent])
_pm_samples = msgspec.msgpack.Decoder(PmSamples)
# cuptiGetVersion of CUPTI 13.5, the first seen to time CUDA graph kernels right in budget windows.
FIRST_CUPTI_TIMING_GRAPHS_IN_WINDOWS = 130500
# How an encoded StackTable or StackChanges begins (its ``type`` key and tag): the probe's event
# chunks that hold them are found by one scan, none decoded.
_has_stacks = re.compile(rb"\xa4type(?:\xabstack_table|\xadstack_changes)").search


def has_stack_events(payload: bytes | memoryview) -> bool:
    """Whether a chunk of encoded events may hold stack events (a scan, no decoding)."""
    return _has_stacks(payload) is not None


def _stride_learner(data: memoryview, valid: int) -> SizeLearner | None:
    """Record sizes from libcupti's ``cuptiActivityGetNextRecord`` (for CUPTI releases without
    ``cuptiActivityGetStructSize``); None where libcupti cannot be loaded here."""
    try:
        from cuptistream.cupti import library

        lib = library.libcupti()
    except Exception:
        return None
    holder = (ctypes.c_char * valid).from_buffer(data) if not data.readonly else None
    if holder is None:
        return None
    base = ctypes.addressof(holder)

    def learn(kind: int, offset: int) -> int | None:
        record = ctypes.c_void_p(base + offset)
        code = lib.cuptiActivityGetNextRecord(base, valid, ctypes.byref(record))
        if code == library.ERROR_MAX_LIMIT_REACHED:
            return valid - offset
        if code != library.SUCCESS or not record.value:
            return None
        return int(record.value) - (base + offset)

    return learn


def _lazy(data: memoryview, valid: int) -> SizeLearner:
    """A learner that loads libcupti only if a record of unknown size turns up."""
    made: list[SizeLearner | None] = []

    def learn(kind: int, offset: int) -> int | None:
        if not made:
            made.append(_stride_learner(data, valid))
        inner = made[0]
        return inner(kind, offset) if inner is not None else None

    return learn


Buffer = tuple[memoryview, int, int]
"""One activity buffer as a probe published it: (data, valid bytes, records CUPTI dropped)."""


def join(buffers: list[Buffer]) -> memoryview:
    """The buffers' valid bytes back to back, writable (a record size may have to be learned
    through libcupti, which needs a writable buffer). Records are whole in each buffer, so the
    join is a buffer of whole records too."""
    joined = bytearray(sum(valid for _, valid, _ in buffers))
    at = 0
    for data, valid, _ in buffers:
        joined[at : at + valid] = data[:valid]
        at += valid
    return memoryview(joined)


class _Window:
    """What one open trace window has decoded so far."""

    def __init__(self, span: TraceSpan) -> None:
        self.span = span  # its open
        self.on_demand = span.on_demand
        self.records: Counter[str] = Counter()
        self.kernel_ns = 0


class DecodeStream:
    """``on_devices`` is told the device ordinals the records named so far, when they grow.
    ``statistics`` (None or disabled: none) turns on the node-side statistics."""

    def __init__(
        self,
        info: OpenStream,
        pid: int,
        emitter: Emitter,
        on_devices: Callable[[set[int]], None] | None = None,
        statistics: StatisticsConfig | None = None,
        names: ProcessNames | None = None,
        columns: bool = False,
    ) -> None:
        """``names``: where the records' name pointers are read (default: ``ProcessNames(pid)``,
        unless ``info`` carries the strings). ``columns``: the hot kinds as ``events.Columns``
        elements (every sink takes them: ``Pipeline.accepts_columns``)."""
        self.info = info
        self.emitter = emitter
        self._on_devices = on_devices
        self._devices_told = 0
        self.origin = f"source:{info.source}"
        self.names: ProcessNames | TableNames = (
            TableNames(info.strings) if info.strings is not None else names or ProcessNames(pid)
        )
        self.decoder = Decoder(
            self.names, RecordLayouts(dict(info.struct_sizes)), info.demangle, self._observe, columns
        )
        self.statistics: Accumulator | None = None
        if statistics is not None and statistics.enabled:
            stacks = StackFold(statistics.interval_ns, statistics.max_stacks, pid) if info.stacks else None
            self.statistics = Accumulator(
                statistics.interval_ns, statistics.max_names, self.names, stacks=stacks
            )
        self._windows: dict[int, _Window] = {}  # open TraceSpans by window number
        self.buffers = 0
        self.decodes = 0  # decode calls: a joined run of buffers is one
        self.events = 0
        self.records_withheld = 0  # decoded for the statistics only (``records: on_demand``)
        self._name_failure_reported = False
        self._late_reported = 0
        self._graph_warned = False
        self._captured: list[capture.CapturedBuffer] = []

    @property
    def records(self) -> int:
        return self.decoder.records_decoded

    @property
    def layouts(self) -> RecordLayouts:
        """The record sizes known so far (the front door walks shed buffers with them)."""
        return self.decoder.layouts

    @property
    def open_spans(self) -> list[TraceSpan]:
        """The opens of the trace windows open now."""
        return [window.span for window in self._windows.values()]

    @property
    def joins(self) -> bool:
        """Whether ``decode_many`` may decode buffers as one (not while capturing them as they came)."""
        return not self.info.capture

    def decode(self, data: memoryview, valid: int, dropped: int) -> None:
        """Decode one buffer and emit its events. Never raises: failures become Loss/Error events."""
        if dropped:
            self.emitter.report_loss("cupti", "cupti_buffer_dropped", dropped, unit="records")
        if not valid:
            return
        if self.info.capture:
            self._captured.append(capture.CapturedBuffer(data=bytes(data[:valid]), dropped=dropped))
        self._decode(data, valid, 1)

    def decode_many(self, buffers: list[Buffer], joined: memoryview | None = None) -> None:
        """Decode consecutive buffers of this stream, in order, as one (``joined``: them already
        joined, ``join``; unused for one buffer): a small buffer costs about what a large one does
        in numpy's per-call work (2.3-2.9 against 0.8-1.0 µs a record for the shipped captures'
        4-167 KB buffers, 2-core VM). Where the join cannot be walked (a record size to learn,
        damage), each buffer is decoded alone, so one bad buffer loses itself only. Never raises."""
        if len(buffers) == 1 or not self.joins:
            for data, valid, dropped in buffers:
                self.decode(data, valid, dropped)
            return
        dropped = sum(b[2] for b in buffers)
        if dropped:
            self.emitter.report_loss("cupti", "cupti_buffer_dropped", dropped, unit="records")
        data = joined if joined is not None else join(buffers)
        if not len(data):
            return
        ends = list(itertools.accumulate(valid for _, valid, _ in buffers))[:-1]
        if not self._decode(data, len(data), sum(1 for b in buffers if b[1]), ends):
            for part, valid, _ in buffers:  # one of them cannot be walked: each alone
                self.decode(part, valid, 0)

    def _decode(self, data: memoryview, valid: int, buffers: int, ends: list[int] | None = None) -> bool:
        """Decode the records of ``buffers`` buffers in ``data[:valid]`` and emit their events. With
        ``ends`` (buffers joined), False on a layout error: nothing was then counted or emitted."""
        learn, at = _lazy(data, valid), ends or ()
        try:
            if self._forwarding():
                chunks = self.decoder.decode_packed(data, valid, learn, at)
            else:
                self.records_withheld += self.decoder.observe(data, valid, learn, at)
                chunks = []
        except LayoutError as error:
            if ends is not None:  # the walk failed, before any record was observed
                return False
            failure: str | None = str(error)
        except Exception as error:
            failure = f"decoding a buffer failed: {error}"
        else:
            failure = None
        self.buffers += buffers
        self.decodes += 1
        if failure is not None:
            self.emitter.report_loss("cupti", "undecodable_buffer", buffers, unit="buffers")
            self.emitter.report_error(self.origin, failure)
            return True
        devices = self.decoder.device_ids
        if self._on_devices is not None and len(devices) > self._devices_told:
            self._devices_told = len(devices)
            self._on_devices(set(devices))  # before the chunks, so their batches name the device
        for chunk in chunks:
            self.events += chunk.count
            self.emitter.emit_chunk(chunk)
        self._emit_statistics(lambda acc: acc.buffer_done())
        self._report_name_failure()
        return True

    def _forwarding(self) -> bool:
        """Whether this buffer's records become events: always, except with ``records: on_demand``
        outside an on-demand window."""
        return self.info.records != "on_demand" or any(w.on_demand for w in self._windows.values())

    def _observe(self, kind: int, event: str, records: np.ndarray) -> None:
        for window in self._windows.values():
            window.records[event] += len(records)
            if event == "kernel" and "graph_id" in (records.dtype.names or ()):
                # Graph nodes cost the program far less than launched kernels (no API call each):
                # counted apart so the probe prices them apart (sources/activity/windows.py).
                in_graph = int(np.count_nonzero(records["graph_id"]))
                if in_graph:
                    window.records["kernel"] -= in_graph
                    window.records["graph_kernel"] += in_graph
                    self._warn_graph_kernels(window.span)
            if event == "kernel":
                window.kernel_ns += int(
                    (records["end"].astype(np.int64) - records["start"].astype(np.int64)).sum()
                )
        if self.statistics is not None:
            try:
                if event == "api" and self.statistics.stacks is not None:
                    self.statistics.stacks.api(kind, records)
                else:
                    self.statistics.add(event, records)
            except Exception as error:  # never at the cost of the raw events
                self._statistics_failed(error)

    def _warn_graph_kernels(self, span: TraceSpan) -> None:
        """Once per stream: CUDA graph kernels traced in a budget window by a CUPTI that times them
        wrong there. With other GPU work between the replays, CUPTI 13.0 gives many of them one
        stale correlation id and ends some of them milliseconds late; 13.5 does not (seen on an
        H100, docs/stacks.md). Window 1 is the stream's first span (full mode's whole run)."""
        if self._graph_warned or span.on_demand or span.window <= 1:
            return
        version = self.info.cupti_version
        if not 0 < version < FIRST_CUPTI_TIMING_GRAPHS_IN_WINDOWS:
            return
        self._graph_warned = True
        self.emitter.report_error(
            self.origin,
            f"CUDA graph kernels traced in a budget window under CUPTI {version}: CUPTI before 13.5 can "
            "give them stale correlation ids and late end times there, so budget-mode GPU time of graph "
            "replays (and GPU time by code) is overstated; install nvidia-cuda-cupti>=13.5",
            severity="warning",
        )

    def stack_events(self, payload: bytes | memoryview, count: int) -> None:
        """One chunk of the process's events that holds stack events (``StackTable``,
        ``StackChanges``), as the probe sent it: for the statistics' stack join. Never raises."""
        stacks = self.statistics.stacks if self.statistics is not None else None
        if stacks is None:
            return
        try:
            events = _events.decode(array_header(count) + bytes(payload))
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            self.emitter.report_error(self.origin, f"stack events not decoded: {error}", severity="warning")
            return
        try:
            stacks.stack_events(events)
        except Exception as error:
            self._statistics_failed(error)

    def pm_samples(self, payload: bytes) -> None:
        """One encoded ``PmSamples`` event of any probe (``collector.pm_samples``), for the
        statistics' kernel attribution. Never raises."""
        if self.statistics is None:
            return
        try:
            samples = _pm_samples.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            self.emitter.report_error(self.origin, f"pm_samples not decoded: {error}", severity="warning")
            return
        try:
            self.statistics.pm_samples(samples)
        except Exception as error:
            self._statistics_failed(error)

    def _emit_statistics(self, step: Callable[[Accumulator], list[Event]]) -> None:
        """Run one step of the statistics and emit the intervals it closed."""
        if self.statistics is None:
            return
        try:
            events = step(self.statistics)
        except Exception as error:
            self._statistics_failed(error)
            return
        if events:
            self.emitter.emit(events)
            self.events += len(events)
        late = self.statistics.late_records if self.statistics is not None else 0
        if late > self._late_reported:
            self.emitter.report_loss("statistics", "late_records", late - self._late_reported, unit="records")
            self._late_reported = late

    def _statistics_failed(self, error: Exception) -> None:
        """A bug in the statistics turns them off for this stream, once, with an error event; the
        raw events go on."""
        self.statistics = None
        self.emitter.report_error(self.origin, f"statistics stopped for this stream: {error!r}")

    def trace_span(self, span: TraceSpan) -> WindowRecords | None:
        """A window opened or closed (call it after draining what the probe published before it).
        On a close, what the window decoded, for the probe; else None."""
        if span.closing:
            if self.statistics is not None:
                self.statistics.window_closing(span.end)
            return None
        self._emit_statistics(lambda acc: acc.span(span.window, span.start, span.end, span.kinds, span.fresh))
        if not span.end:
            self._windows[span.window] = _Window(span)
            return None
        window = self._windows.pop(span.window, None)
        if window is None:  # a close without its open: nothing was counted
            return WindowRecords(stream=span.stream, window=span.window)
        return WindowRecords(
            stream=span.stream, window=span.window, records=dict(window.records), kernel_ns=window.kernel_ns
        )

    def _report_name_failure(self) -> None:
        names = self.names
        if isinstance(names, ProcessNames) and names.failure and not self._name_failure_reported:
            self._name_failure_reported = True
            self.emitter.report_error(self.origin, names.failure, severity="warning")

    def close(self) -> None:
        self._emit_statistics(lambda acc: acc.close())
        names = self.names
        if isinstance(names, ProcessNames):
            if names.unresolved:
                self.emitter.report_loss("collector", "name_unresolved", names.unresolved, unit="names")
            names.close()
        if self.info.capture:
            strings = names.seen if isinstance(names, ProcessNames) else names.table
            capture.write(
                self.info.capture,
                capture.Capture(
                    name=self.info.source, cupti_version=self.info.cupti_version, device=self.info.device,
                    struct_sizes=dict(self.decoder.layouts.sizes), strings=dict(strings),
                    buffers=self._captured, clock=self.info.clock,
                ),
            )  # fmt: skip
