"""Events → OTLP spans: which span is whose parent and which trace it belongs to.

The tree (docs/otlp.md, "Traces"):

    NVTX range (outermost on the thread)            ← root; names the trace under nvtx_top_level
      NVTX range (nested, same thread)
        runtime API call (same thread, enclosed in time)
          driver API call (same correlation id)
          kernel / memcpy / memset / sync / graph launch (same correlation id)

GPU work is a *child* of the API call that launched it (not a link): a backend then shows the
kernel one click below ``cudaLaunchKernel``, and "all kernels under this NVTX step" is a plain
descendant query. Both carry ``cuda.correlation_id`` for joins.

CUPTI reports a range when it *ends*, after the API calls it encloses, and a kernel after its
launch, often in a later buffer. So a span may wait up to ``reorder_window`` (wall time) for the
span that decides its parent and trace; after that it is sent with what is known. Waiting is only
done where it can pay off: API calls wait only on threads that have used NVTX, GPU work only once
API calls have been seen at all.

All ids are derived from the session id and the event's identity, so a resent batch produces the
same ids. A span's name and attributes are ``otlp_span_attributes``.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cuptistream.events import (
    ApiCall,
    Batch,
    Device,
    Event,
    GraphLaunch,
    Kernel,
    Memcpy,
    Memset,
    NvtxRange,
    Synchronization,
)

from . import wire as wire
from .common import derive_id
from .span_attributes import describe

GpuWork = Kernel | Memcpy | Memset | Synchronization | GraphLaunch
SPAN_EVENTS = (Kernel, Memcpy, Memset, Synchronization, GraphLaunch, ApiCall, NvtxRange)

_RECENT_RANGES_PER_THREAD = 1024  # released ranges kept to parent late-arriving API calls
_RESOLVED_CALLS = 200_000  # correlation ids remembered to parent late-arriving GPU work


@dataclass(slots=True, eq=False)
class _Item:
    event: Event
    start: int  # Unix-epoch ns
    end: int
    arrival: float  # monotonic seconds when the sink received it
    span_id: bytes
    trace_id: bytes = b""
    parent_id: bytes = b""


@dataclass(slots=True)
class _Range:
    start: int
    end: int
    depth: int
    span_id: bytes
    root_trace: bytes  # the trace this range's tree belongs to


@dataclass
class _ThreadRanges:
    """NVTX ranges known on one thread, sorted by start, for "which ranges enclose [s, e]"."""

    items: list[_Range] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)

    def add(self, r: _Range) -> None:
        i = bisect.bisect_right(self.starts, r.start)
        self.starts.insert(i, r.start)
        self.items.insert(i, r)

    def enclosing(self, start: int, end: int, exclude: bytes = b"") -> tuple[_Range | None, _Range | None]:
        """(innermost, outermost) range enclosing [start, end]; stops at the first depth-0 one."""
        inner = outer = None
        for i in range(bisect.bisect_right(self.starts, start) - 1, -1, -1):
            r = self.items[i]
            if r.end >= end and r.span_id != exclude:
                inner = inner or r
                outer = r
                if r.depth == 0:
                    break
        return inner, outer


class SpanAssembler:
    """Turns batches into encoded spans (``Span`` bytes), holding each until its parent is known
    or it has waited long enough.

    ``add`` returns the spans ready now; ``flush`` returns every span still waiting.
    """

    def __init__(
        self,
        grouping: str = "nvtx_top_level",
        window_s: float = 1.0,
        reorder_window_s: float = 2.0,
        max_pending: int = 200_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grouping = grouping
        self.window_ns = int(window_s * 1e9)
        self.reorder_window_s = reorder_window_s
        self.max_pending = max_pending
        self.clock = clock
        self.session_id = ""
        self.devices: dict[int, tuple[str, str]] = {}  # device id -> (uuid, name)
        self._pending: list[_Item] = []
        self._nvtx_threads: set[int] = set()
        self._api_seen = False
        self._ranges: dict[int, deque[_Range]] = {}  # released ranges per thread
        self._calls: OrderedDict[int, tuple[bytes, bytes, str]] = OrderedDict()  # corr -> trace, span, domain
        self.forced = 0  # spans sent before their parent was known (reorder window or pending cap)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, batch: Batch) -> list[bytes]:
        self.session_id = batch.session_id
        for dev in batch.resource.devices:
            self.devices[dev.device_id] = (dev.uuid, dev.name)
        offset, now = batch.clock.offset_ns, self.clock()
        for event in batch.events:
            if isinstance(event, SPAN_EVENTS):
                self._pending.append(self._item(event, offset, now))
            elif isinstance(event, Device):
                self.devices[event.device_id] = (event.uuid, event.name)
        return self._release(force_all=False)

    def release(self) -> list[bytes]:
        """The waiting spans whose parent is now known or whose wait is over."""
        return self._release(force_all=False)

    def flush(self) -> list[bytes]:
        return self._release(force_all=True)

    # --- identity ----------------------------------------------------------------------------

    def _item(self, event: Event, offset: int, now: float) -> _Item:
        sid = self.session_id
        if isinstance(event, NvtxRange):
            self._nvtx_threads.add(event.thread_id)
            span_id = derive_id(8, sid, "nvtx", event.thread_id, event.start, event.range_id, event.depth)
        elif isinstance(event, ApiCall):
            self._api_seen = True
            span_id = derive_id(8, sid, "api", event.domain, event.correlation_id, event.start)
        else:
            assert isinstance(event, GpuWork)
            node = getattr(event, "graph_node_id", 0)
            device = getattr(event, "device_id", event.context_id)
            span_id = derive_id(
                8, sid, event.__struct_config__.tag, device, event.correlation_id, node, event.start
            )
        return _Item(event, event.start + offset, event.end + offset, now, span_id)

    def _root_trace(self, item: _Item) -> bytes:
        """The trace id of a tree whose root is ``item``."""
        if self.grouping == "nvtx_top_level" and isinstance(item.event, NvtxRange):
            return self._range_trace(item.event.thread_id, item.start)
        return derive_id(16, self.session_id, "window", item.start // self.window_ns)

    def _range_trace(self, thread_id: int, start: int) -> bytes:
        if self.grouping == "nvtx_top_level":
            return derive_id(16, self.session_id, "trace", thread_id, start)
        return derive_id(16, self.session_id, "window", start // self.window_ns)

    # --- resolution --------------------------------------------------------------------------

    def _release(self, force_all: bool) -> list[bytes]:
        pending = self._pending  # in arrival order
        overflow = {id(i) for i in pending[: max(0, len(pending) - self.max_pending)]}
        deadline = self.clock() - self.reorder_window_s
        threads: dict[int, _ThreadRanges] = {}
        for tid, released in self._ranges.items():
            tr = threads.setdefault(tid, _ThreadRanges())
            for r in released:
                tr.add(r)
        ranges: list[_Item] = []
        calls: list[_Item] = []
        work: list[_Item] = []
        for item in pending:
            ev = item.event
            if isinstance(ev, NvtxRange):
                ranges.append(item)  # pending ranges take part in the lookup as if they were roots
                threads.setdefault(ev.thread_id, _ThreadRanges()).add(
                    _Range(
                        item.start,
                        item.end,
                        ev.depth,
                        item.span_id,
                        self._range_trace(ev.thread_id, item.start),
                    )
                )
            elif isinstance(ev, ApiCall):
                calls.append(item)
            else:
                work.append(item)
        ranges.sort(key=_depth)  # parents before children: outer ranges, runtime calls, driver calls, work
        calls.sort(key=lambda i: i.event.domain != "runtime")  # type: ignore[attr-defined]
        ready: list[_Item] = []
        waiting: list[_Item] = []
        calls_now: dict[int, tuple[bytes, bytes, str] | None] = {}  # None: that call is waiting
        for item in (*ranges, *calls, *work):
            forced = force_all or item.arrival <= deadline or id(item) in overflow
            if self._resolve(item, threads, calls_now, forced):
                ready.append(item)
            else:
                waiting.append(item)
        self.forced += sum(1 for i in ready if i.parent_id == b"" and i.arrival <= deadline)
        self._pending = sorted(waiting, key=lambda i: i.arrival)
        for item in ready:
            if isinstance(item.event, NvtxRange):
                recent = self._ranges.setdefault(
                    item.event.thread_id, deque(maxlen=_RECENT_RANGES_PER_THREAD)
                )
                recent.append(_Range(item.start, item.end, item.event.depth, item.span_id, item.trace_id))
        return [self._span(item) for item in ready]

    def _resolve(
        self,
        item: _Item,
        threads: dict[int, _ThreadRanges],
        calls_now: dict[int, tuple[bytes, bytes, str] | None],
        forced: bool,
    ) -> bool:
        """Set the item's trace and parent; False if it should wait for more events."""
        ev = item.event
        if isinstance(ev, GpuWork):
            call = calls_now.get(ev.correlation_id) or self._calls.get(ev.correlation_id)
            if call is not None:
                item.trace_id, item.parent_id = call[0], call[1]
                return True
            if self._api_seen and not forced:
                return False  # its launching call may still arrive
            item.trace_id = self._root_trace(item)
            return True
        assert isinstance(ev, NvtxRange | ApiCall)
        if isinstance(ev, ApiCall) and ev.domain != "runtime":
            call = calls_now.get(ev.correlation_id) or self._calls.get(ev.correlation_id)
            if call is not None and call[2] == "runtime":  # a driver call made by a runtime call
                item.trace_id, item.parent_id = call[0], call[1]
                return self._note_call(item, ev, calls_now)
            if ev.correlation_id in calls_now and not forced:
                return False  # its runtime call is waiting: wait with it
        tr = threads.get(ev.thread_id)
        inner, outer = tr.enclosing(item.start, item.end, item.span_id) if tr else (None, None)
        complete = (outer is not None and outer.depth == 0) or (isinstance(ev, NvtxRange) and ev.depth == 0)
        if not complete and ev.thread_id in self._nvtx_threads and not forced:
            if isinstance(ev, ApiCall):
                calls_now.setdefault(ev.correlation_id, None)
            return False  # an enclosing range may still arrive
        item.parent_id = inner.span_id if inner else b""
        item.trace_id = outer.root_trace if outer else self._root_trace(item)
        if isinstance(ev, ApiCall):
            self._note_call(item, ev, calls_now)
        return True

    def _note_call(
        self, item: _Item, ev: ApiCall, calls_now: dict[int, tuple[bytes, bytes, str] | None]
    ) -> bool:
        """Remember a resolved call so its GPU work (now or in later batches) can hang under it."""
        known = calls_now.get(ev.correlation_id) or self._calls.get(ev.correlation_id)
        if known is None or known[2] != "runtime":  # GPU work hangs under the runtime call if there is one
            entry = (item.trace_id, item.span_id, ev.domain)
            calls_now[ev.correlation_id] = entry
            self._calls[ev.correlation_id] = entry
            if len(self._calls) > _RESOLVED_CALLS:
                self._calls.popitem(last=False)
        return True

    # --- protobuf ----------------------------------------------------------------------------

    def _span(self, item: _Item) -> bytes:
        name, attrs, status = describe(item.event, self.devices)
        end = max(item.end, item.start)
        return wire.span(item.trace_id, item.span_id, item.parent_id, name, item.start, end, attrs, status)


def _depth(item: _Item) -> int:
    ev = item.event
    assert isinstance(ev, NvtxRange)
    return ev.depth
