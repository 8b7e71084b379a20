"""``RemoteStream``: a probe connection's stand-in for a ``DecodeStream`` that lives in a decode
worker (``collector.workers``). Same surface as ``DecodeStream`` for the connection; each call is
one request, and what the worker's stream emitted comes back in the reply and is replayed here,
on the connection's emitter, in order.

When the link breaks (the worker died, hung, or failed a request), the buffer it had is counted
lost (``Loss(stage="collector", reason="decode_worker_died" | "decode_worker_failed")``, in records
when its headers can be walked, else one buffer), one ``Error`` event says so, and the stream goes
on as a ``DecodeStream`` in the connection's thread. That buffer is not decoded again here: if it
is what killed the worker, it would kill the collector. What the worker's stream held is gone with
it: the statistics of intervals not yet emitted, NVTX ranges still open, buffers kept for
``capture``; the trace windows still open are reopened here and count from now on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence

import msgspec

from cuptistream.channel.messages import OpenStream, TraceSpan, WindowRecords
from cuptistream.collector import handover, shedding
from cuptistream.collector import worker_protocol as wp
from cuptistream.collector.decoding import Buffer, DecodeStream
from cuptistream.collector.names import ProcessNames, open_memory
from cuptistream.collector.worker_pool import Link
from cuptistream.config.model import StatisticsConfig
from cuptistream.cupti.records import RecordLayouts
from cuptistream.plugin import Emitter
from cuptistream.recording.codec import Chunk, ChunkGroup

ORIGIN = "collector:decode_worker"


class RemoteStream:
    def __init__(
        self,
        link: Link,
        info: OpenStream,
        pid: int,
        emitter: Emitter,
        on_devices: Callable[[set[int]], None] | None = None,
        statistics: StatisticsConfig | None = None,
        columns: bool = False,
        state: bytes | None = None,
        open_spans: Sequence[TraceSpan] = (),
    ) -> None:
        """``state``: the stream so far, decoded in the connection's thread until now
        (``handover.dump``), adopted by the worker instead of opening a new one; ``open_spans``:
        its trace windows open now (``DecodeStream.open_spans``), reopened here should the worker
        die. Never raises."""
        self.link = link
        self.columns = columns
        self.info = info
        self.pid = pid
        self.emitter = emitter
        self._on_devices = on_devices
        self._statistics = statistics
        self.layouts = RecordLayouts(dict(info.struct_sizes))  # for the front door's header walks
        self.local: DecodeStream | None = None  # after the link broke
        self._counts = wp.Reply()  # the worker stream's counters, as of its last reply
        self._open_spans: dict[int, TraceSpan] = {span.window: span for span in open_spans}
        if state is not None:
            self._adopt(state)
            return
        on = statistics is not None and statistics.enabled
        fd, failure = open_memory(pid) if info.strings is None else (None, None)
        request = wp.Open(
            info, pid, on, statistics.interval_ns if statistics else 0,
            statistics.max_names if statistics else 0, fd is not None, failure, columns,
            statistics.max_stacks if statistics else 1,
        )  # fmt: skip
        try:
            reply = link.request(request, [fd] if fd is not None else None)
        finally:
            if fd is not None:
                os.close(fd)  # the worker holds its own copy
        if reply is None:
            self._fall_back([])
        else:
            self._replay(reply)

    # --- what DecodeStream offers the connection ----------------------------------------------

    @property
    def buffers(self) -> int:
        return self._counts.buffers + (self.local.buffers if self.local else 0)

    @property
    def decodes(self) -> int:
        return self._counts.decodes + (self.local.decodes if self.local else 0)

    @property
    def records(self) -> int:
        return self._counts.records + (self.local.records if self.local else 0)

    @property
    def records_withheld(self) -> int:
        return self._counts.records_withheld + (self.local.records_withheld if self.local else 0)

    @property
    def events(self) -> int:
        return self._counts.events + (self.local.events if self.local else 0)

    @property
    def joins(self) -> bool:
        """As ``DecodeStream.joins``: consecutive buffers may go in one request."""
        return not self.info.capture

    def decode_slots(self, pool: int, slots: list[tuple[int, Buffer]]) -> None:
        """Decode the buffers in ``slots`` (slot number, its buffer) of ``pool``, consecutive in
        this stream, as one request (the caller releases the slots after this returns). Never
        raises."""
        if self.local is None and self.link.broken:
            self._fall_back([])
        if self.local is not None:
            self.local.decode_many([buffer for _, buffer in slots])
            return
        (first, (_, valid, dropped)), more = slots[0], slots[1:]
        request = wp.Decode(
            self.info.stream, pool, first, valid, dropped, more=tuple((s, b[1], b[2]) for s, b in more)
        )
        if self.link.decode(request, self._replay) is not None:
            return
        if self.link.sent:  # the worker had them: lost
            self._fall_back([buffer for _, buffer in slots])
        else:
            self._fall_back([])
            self.decode_slots(pool, slots)

    def trace_span(self, span: TraceSpan) -> WindowRecords | None:
        if span.end and not span.closing:
            self._open_spans.pop(span.window, None)
        if self.local is None:
            reply = self.link.request(wp.Span(span))
            if reply is not None:
                self._replay(reply)
                if not span.end:
                    self._open_spans[span.window] = span
                return reply.window
            self._fall_back([])
        assert self.local is not None
        return self.local.trace_span(span)

    def stack_events(self, payload: bytes, count: int) -> None:
        """As ``DecodeStream.stack_events``: handed to the worker's stream. Never raises."""
        if self.local is None and not self.link.broken:
            reply = self.link.request(wp.Stacks(self.info.stream, payload, count))
            if reply is not None:
                self._replay(reply)
                return
            self._fall_back([])
        if self.local is not None:
            self.local.stack_events(payload, count)

    def pm_samples(self, payload: bytes) -> None:
        """As ``DecodeStream.pm_samples``: handed to the worker's stream. Never raises."""
        if self.local is None and not self.link.broken:
            reply = self.link.request(wp.Samples(self.info.stream, payload))
            if reply is not None:
                self._replay(reply)
                return
            self._fall_back([])
        if self.local is not None:
            self.local.pm_samples(payload)

    @property
    def movable(self) -> bool:
        """Whether ``move`` may take it to another worker: it decodes in one, and does not capture."""
        return self.local is None and not self.link.broken and not self.info.capture

    def move(self, link: Link) -> None:
        """Hand this stream over to the worker of ``link`` (the connection's next link, its pools
        mapped there), state and all (``handover``). Never raises. Where the old worker cannot hand
        it over (it died), it is lost as a broken link loses it; where the new one cannot take it,
        the state is kept: it decodes in this thread from then on."""
        reply = self.link.request(wp.Export(self.info.stream))
        if reply is None or reply.state is None:
            self._fall_back([])
            return
        self._replay(reply)
        self.link = link
        self._adopt(reply.state)

    def _adopt(self, state: bytes) -> None:
        """Have ``self.link``'s worker take the stream ``state`` is; where it cannot, the stream
        goes on from ``state`` in this thread."""
        opened = open_memory(self.pid) if self.info.strings is None else None
        fd, failure = opened or (None, None)
        adopt = wp.Adopt(self.info.stream, state, opened is not None, failure)
        try:
            taken = self.link.request(adopt, [fd] if fd is not None else None)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        if taken is not None:
            if fd is not None:
                os.close(fd)  # the worker holds its own copy
            self._replay(taken)
            return
        # Keep what it had: the state, restored here (with its own counters, which go on from
        # there), reading the program's memory through the same fd (the stream's now)
        self._tell_broken(lost="", kept=True)
        self.local = handover.load(state, self.emitter, self._on_devices, opened)
        self._counts = wp.Reply()

    def close(self) -> None:
        """Close the stream (the connection closes the link after all its streams)."""
        if self.local is not None:
            self.local.close()
            return
        reply = self.link.request(wp.Close(self.info.stream))
        if reply is None:
            self._tell_broken(lost="")
        else:
            self._replay(reply)

    # --- replies and the fall-back --------------------------------------------------------------

    def _replay(self, reply: wp.Reply) -> None:
        emitter = self.emitter
        # The reply's chunks are views into one block (a mapping, or a heap buffer), and those the
        # worker packed into a reply slot into that slot: each stays, whole, until the last of the
        # reply's chunks is let go, and the memory budget counts them until then (in a slot, the
        # part this reply packed: the slot holds the link's other replies too).
        sent = [call.payload for call in reply.calls if isinstance(call, wp.EmitChunk)]
        slotted = [call for call in reply.calls if isinstance(call, wp.EmitSlotChunk)]
        calls = [
            wp.EmitChunk(self.link.slot_view(c.slot, c.offset, c.size), c.count, c.elements)
            if isinstance(c, wp.EmitSlotChunk)
            else c
            for c in reply.calls
        ]
        group = None
        if slotted or (sent and isinstance(sent[0], memoryview)):
            # The socket's block counts whole (its mapping), a slot the part this reply packed.
            block = len(sent[0].obj) if sent and isinstance(sent[0], memoryview) else 0  # type: ignore[arg-type]
            block = max(block, sum(len(p) for p in sent))
            packed = 0
            if slotted:
                packed = max(c.offset + c.size for c in slotted) - min(c.offset for c in slotted)
            group = ChunkGroup(len(sent) + len(slotted), block + packed)
        for call in calls:
            if isinstance(call, wp.EmitChunk):
                emitter.emit_chunk(Chunk(call.payload, call.count, group=group, elements=call.elements))
            elif isinstance(call, wp.ReportLoss):
                emitter.report_loss(call.stage, call.reason, call.count, call.unit)
            elif isinstance(call, wp.ReportError):
                emitter.report_error(call.origin, call.message, call.severity, call.result_code)
            elif self._on_devices is not None:
                self._on_devices(set(call.ordinals))
        # The counters only: a reply's chunks are the pipeline's now, and kept here they would stay in
        # memory after the sinks let go of them, outside memory_budget (23 MiB per probe with 4 MiB buffers).
        self._counts = msgspec.structs.replace(reply, calls=[], window=None, sizes=None)
        if reply.sizes:
            self.layouts.sizes.update(reply.sizes)

    def _fall_back(self, in_flight: list[Buffer]) -> None:
        """Decode in this thread from now on; ``in_flight``: the buffers the worker had, lost."""
        reason = self.link.reason
        records = unwalkable = 0
        for view, valid, dropped in in_flight:
            counted = shedding.count_lost(
                view, valid, dropped, self.layouts, self.emitter, "collector", reason
            )
            if counted is None:  # its headers cannot be walked: CUPTI's count, and one buffer
                if dropped:
                    self.emitter.report_loss("cupti", "cupti_buffer_dropped", dropped, unit="records")
                self.emitter.report_loss("collector", reason, 1, unit="buffers")
                unwalkable += 1
            else:
                records += counted
        lost = []
        if records:
            lost.append(f"{records} records")
        if unwalkable:
            lost.append(f"{unwalkable} buffer(s)")
        self._tell_broken(f"; what it was decoding is lost ({', '.join(lost)})" if lost else "")
        names = ProcessNames(self.pid) if self.info.strings is None else None
        local = DecodeStream(
            self.info, self.pid, self.emitter, self._on_devices, self._statistics, names, self.columns
        )
        local.layouts.sizes.update(self.layouts.sizes)
        for span in self._open_spans.values():
            local.trace_span(span)
        self.local = local

    def _tell_broken(self, lost: str, kept: bool = False) -> None:
        """One Error event per link (all the connection's streams share it). ``kept``: the stream
        came back whole (a move the new worker could not take)."""
        if self.link.told:
            return
        self.link.told = True
        held = "nothing was lost" if kept else "the statistics of intervals the worker held are lost"
        with contextlib.suppress(Exception):
            self.emitter.report_error(
                ORIGIN,
                f"{self.link.problem}{lost}; probe {self.pid} is decoded on its connection thread "
                f"from now on ({held})",
            )
