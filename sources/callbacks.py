"""The ``callbacks`` source: CUPTI callback domains as events.

Domains (``domains:`` in YAML):

- ``resource``: context, stream and module lifecycle (``ResourceChange``; modules carry CUPTI's cubin
  CRC and size, the same CRC that PC sampling reports) and graph / graph-node create, clone and
  destroy (``GraphNode``);
- ``synchronize``: stream and context synchronizations (``Synchronization``, a point in time:
  ``start == end`` is when CUPTI reported that the synchronization finished);
- ``nvtx``: ranges (push/pop with per-thread nesting depth, start/end), markers, domains, categories,
  payloads and colours (``NvtxRange``, ``NvtxMarker``);
- ``runtime`` / ``driver``: the API functions named in ``runtime_api`` / ``driver_api`` only, with
  entry and exit times (``ApiCall``).

How it stays cheap: each callback runs inside the application's CUDA or NVTX call. It reads the
few fields it needs straight from CUPTI's structs (ctypes, following ``cupti_callbacks.h``), appends
one plain tuple to a deque and returns. A worker thread turns tuples into events and hands them to
the emitter in chunks. When the deque holds ``max_buffered`` records, new ones are dropped and
counted as a loss; a callback never waits.

NVTX needs CUPTI injected into NVTX before the program's first NVTX call: ``NVTX_INJECTION64_PATH``
must name libcupti. ``start()`` sets it (unless already set) when ``nvtx`` is enabled, which is in
time for a session opened before the first NVTX call; ``cuptistream run`` sets it for the child.

Failure modes: ``start()`` raises ``SubscriberBusy`` when another tool holds CUPTI's callback
subscriber (the session disables this source and emits an Error event naming that tool),
``CuptiUnavailable`` without a driver. A ``runtime_api``/``driver_api`` pattern that matches no
function is a config error when the config is loaded. A failure in the worker is reported as an
Error event and the worker keeps going.
"""

from __future__ import annotations

import collections
import ctypes
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, Literal

import msgspec

from cuptistream.component import Source
from cuptistream.config import Duration, SourceConfig, require_at_least, require_positive
from cuptistream.cupti import api_functions, cubin_api, library, subscriber
from cuptistream.cupti.contexts import module_data
from cuptistream.cupti.driver import enable_nvtx_injection
from cuptistream.cupti.subscriber import API_ENTER as _API_ENTER
from cuptistream.cupti.subscriber import ApiCallbackData as _CallbackData
from cuptistream.cupti.subscriber import Domain, Registration, address_of
from cuptistream.events import (
    ApiCall,
    Event,
    GraphNode,
    NvtxMarker,
    NvtxRange,
    ResourceChange,
    Synchronization,
)

CallbackDomainName = Literal["resource", "synchronize", "nvtx", "runtime", "driver"]

# Launches, copies, sets and synchronizations: what a performance engineer reads first, at a
# fraction of the cost of every API call (DESIGN.md §5).
DEFAULT_RUNTIME_API = [
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cudaGraphLaunch",
    "cudaMemcpy", "cudaMemcpyAsync", "cudaMemset", "cudaMemsetAsync",
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
]  # fmt: skip
DEFAULT_DRIVER_API = [
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
    "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyAsync",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
]  # fmt: skip


class CallbacksConfig(SourceConfig):
    domains: list[CallbackDomainName] = msgspec.field(
        default_factory=lambda: ["resource", "synchronize", "nvtx"]
    )
    # API functions traced when "runtime" / "driver" is in ``domains``: patterns (globs) over CUPTI's
    # function names, the rule of ``cupti.api_functions`` that the activity source uses too.
    runtime_api: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_RUNTIME_API))
    driver_api: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_DRIVER_API))
    flush_interval: Duration = Duration(0.5)  # how often the worker hands records to the pipeline
    max_buffered: int = 1_000_000  # records held between hand-offs; beyond that they are dropped
    chunk_events: int = 4096  # events per hand-off
    nvtx_injection: bool = True  # set NVTX_INJECTION64_PATH to libcupti when nvtx is enabled

    def __post_init__(self) -> None:
        for domain, patterns in (("runtime", self.runtime_api), ("driver", self.driver_api)):
            if domain in self.domains:
                api_functions.check_patterns(domain, patterns)
        require_positive("flush_interval", self.flush_interval)
        require_at_least("max_buffered", self.max_buffered, 1)
        require_at_least("chunk_events", self.chunk_events, 1)


# --- CUPTI's structs (cupti_callbacks.h) and NVTX's event attributes (nvToolsExt.h) ------------


class _NvtxData(ctypes.Structure):
    _fields_ = [
        ("functionName", ctypes.c_void_p),
        ("functionParams", ctypes.c_void_p),
        ("functionReturnValue", ctypes.c_void_p),
    ]


class _ResourceData(ctypes.Structure):
    _fields_ = [("context", ctypes.c_void_p), ("stream", ctypes.c_void_p), ("descriptor", ctypes.c_void_p)]


class _GraphData(ctypes.Structure):
    _fields_ = [
        ("graph", ctypes.c_void_p),
        ("originalGraph", ctypes.c_void_p),
        ("node", ctypes.c_void_p),
        ("originalNode", ctypes.c_void_p),
        ("nodeType", ctypes.c_int32),
        ("dependency", ctypes.c_void_p),
        ("graphExec", ctypes.c_void_p),
    ]


class _SynchronizeData(ctypes.Structure):
    _fields_ = [("context", ctypes.c_void_p), ("stream", ctypes.c_void_p)]


class _Payload(ctypes.Union):
    _fields_ = [
        ("u64", ctypes.c_uint64),
        ("i64", ctypes.c_int64),
        ("f64", ctypes.c_double),
        ("u32", ctypes.c_uint32),
        ("i32", ctypes.c_int32),
        ("f32", ctypes.c_float),
    ]


class EventAttributes(ctypes.Structure):
    """``nvtxEventAttributes_t`` (version 2/3, 48 bytes)."""

    _fields_ = [
        ("version", ctypes.c_uint16),
        ("size", ctypes.c_uint16),
        ("category", ctypes.c_uint32),
        ("colorType", ctypes.c_int32),
        ("color", ctypes.c_uint32),
        ("payloadType", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("payload", _Payload),
        ("messageType", ctypes.c_int32),
        ("message", ctypes.c_void_p),  # const char*, const wchar_t* or nvtxStringHandle_t
    ]


_COLOR_ARGB = 1
_MESSAGE_ASCII, _MESSAGE_UNICODE, _MESSAGE_REGISTERED = 1, 2, 3
_PAYLOAD_FIELDS = {1: "u64", 2: "i64", 3: "f64", 4: "u32", 5: "i32", 6: "f32"}

# CUPTI_CBID_NVTX_* (cupti_nvtx_cbid.h)
_NVTX_MARK_A, _NVTX_MARK_W, _NVTX_MARK_EX = 1, 2, 3
_NVTX_START_A, _NVTX_START_W, _NVTX_START_EX, _NVTX_END = 4, 5, 6, 7
_NVTX_PUSH_A, _NVTX_PUSH_W, _NVTX_PUSH_EX, _NVTX_POP = 8, 9, 10, 11
_NVTX_DOMAIN_MARK_EX, _NVTX_DOMAIN_START_EX, _NVTX_DOMAIN_END = 30, 31, 32
_NVTX_DOMAIN_PUSH_EX, _NVTX_DOMAIN_POP = 33, 34
_NVTX_REGISTER_STRING_A, _NVTX_REGISTER_STRING_W = 39, 40
_NVTX_DOMAIN_CREATE_A, _NVTX_DOMAIN_CREATE_W = 41, 42

# CUPTI_CBID_RESOURCE_* and CUPTI_CBID_SYNCHRONIZE_*
_RESOURCE_OPS = {
    1: "context_create", 2: "context_destroy", 3: "stream_create", 4: "stream_destroy",
    6: "module_load", 7: "module_unload",
}  # fmt: skip
_GRAPH_OPS = {
    9: "graph_create", 10: "graph_destroy", 11: "graph_clone",
    13: "node_create", 14: "node_destroy", 20: "node_clone",
    18: "graph_exec_create", 19: "graph_exec_destroy",
}  # fmt: skip
RESOURCE_CBIDS = frozenset(_RESOURCE_OPS) | frozenset(_GRAPH_OPS)
_SYNC_TYPES = {1: "stream_synchronize", 2: "context_synchronize"}

# CUgraphNodeType (cuda.h)
GRAPH_NODE_TYPES = [
    "kernel", "memcpy", "memset", "host", "graph", "empty", "wait_event", "event_record",
    "ext_semas_signal", "ext_semas_wait", "mem_alloc", "mem_free", "batch_mem_op", "conditional",
]  # fmt: skip

# Record tags: the first element of each buffered tuple.
_API, _RANGE, _MARK, _RESOURCE, _GRAPH, _SYNC = range(6)


def _graph_node_type(value: int) -> str:
    return GRAPH_NODE_TYPES[value] if value < len(GRAPH_NODE_TYPES) else str(value)


def _void_at(address: int) -> int:
    return ctypes.c_void_p.from_address(address).value or 0


def _text(pointer: int, wide: bool = False) -> str:
    if not pointer:
        return ""
    return ctypes.wstring_at(pointer) if wide else ctypes.string_at(pointer).decode(errors="replace")


# --- CUPTI look-ups the callbacks need, separated so tests can supply them -------------------


class CuptiIds:
    """Ids and the clock, from cupti-python. Every method is a cheap CUPTI call, safe in callbacks."""

    def __init__(self, cupti: Any) -> None:
        self.now: Callable[[], int] = cupti.get_timestamp
        self._cupti = cupti

    def context(self, context: int) -> tuple[int, int]:
        """(device id, context id) of a CUcontext."""
        return self._cupti.get_device_id(context), self._cupti.get_context_id(context)

    def stream(self, context: int, stream: int) -> int:
        return int(self._cupti.get_stream_id_ex(context, stream, 0))

    def graph(self, graph: int) -> int:
        return int(self._cupti.get_graph_id(graph)) if graph else 0

    def node(self, node: int) -> int:
        return int(self._cupti.get_graph_node_id(node)) if node else 0

    def cubin_crc(self, cubin: int, size: int) -> int:
        """CUPTI's CRC of a cubin (``cuptiGetCubinCrc``), as PC sampling and SASS records report it."""
        try:
            return cubin_api.cubin_crc_at(cubin, size)
        except library.CuptiError:
            return 0


# --- the callback side: tiny handlers that append tuples ------------------------------------


class Recorder:
    """Handlers for each domain. They run on the application's threads and only append tuples."""

    def __init__(self, ids: CuptiIds, max_buffered: int) -> None:
        self.ids = ids
        self.records: collections.deque[tuple[Any, ...]] = collections.deque()
        self.max_buffered = max_buffered
        self.dropped = 0
        self._open_calls: dict[tuple[int, int], int] = {}  # (domain, correlation id) -> entry time
        self._local = threading.local()  # .stacks: {nvtx domain handle: [open push ranges]}
        self._started: dict[int, tuple[Any, ...]] = {}  # nvtx range id -> start/end range start
        self.domain_names: dict[int, str] = {}  # nvtx domain handle -> name
        self.strings: dict[int, str] = {}  # nvtx registered string handle -> text
        self._nvtx = {
            _NVTX_MARK_A: self._mark_a, _NVTX_MARK_W: self._mark_w, _NVTX_MARK_EX: self._mark_ex,
            _NVTX_START_A: self._start_a, _NVTX_START_W: self._start_w, _NVTX_START_EX: self._start_ex,
            _NVTX_END: self._end, _NVTX_PUSH_A: self._push_a, _NVTX_PUSH_W: self._push_w,
            _NVTX_PUSH_EX: self._push_ex, _NVTX_POP: self._pop,
            _NVTX_DOMAIN_MARK_EX: self._domain_mark, _NVTX_DOMAIN_START_EX: self._domain_start,
            _NVTX_DOMAIN_END: self._domain_end, _NVTX_DOMAIN_PUSH_EX: self._domain_push,
            _NVTX_DOMAIN_POP: self._domain_pop,
            _NVTX_DOMAIN_CREATE_A: self._domain_create, _NVTX_DOMAIN_CREATE_W: self._domain_create_w,
            _NVTX_REGISTER_STRING_A: self._register_string, _NVTX_REGISTER_STRING_W: self._register_string_w,
        }  # fmt: skip

    def _put(self, record: tuple[Any, ...]) -> None:
        if len(self.records) >= self.max_buffered:
            self.dropped += 1
        else:
            self.records.append(record)

    # runtime and driver API ---------------------------------------------------------------------

    def on_api(self, domain: int, cbid: int, data: Any) -> None:
        address = address_of(data)
        if not address:
            return
        info = _CallbackData.from_address(address)
        key = (domain, info.correlationId)
        if info.callbackSite == _API_ENTER:
            self._open_calls[key] = self.ids.now()
            return
        end = self.ids.now()
        start = self._open_calls.pop(key, end)
        result = info.functionReturnValue
        status = ctypes.c_int32.from_address(result).value if result else 0
        self._put((_API, domain, cbid, start, end, threading.get_native_id(), info.correlationId, status))

    # resource and synchronize ---------------------------------------------------------------------

    def on_resource(self, domain: int, cbid: int, data: Any) -> None:
        if cbid not in RESOURCE_CBIDS:
            return
        address = address_of(data)
        if not address:
            return
        now = self.ids.now()
        res = _ResourceData.from_address(address)
        context = res.context or 0
        if cbid in _GRAPH_OPS:
            self._graph(cbid, now, res.descriptor)
            return
        op = _RESOURCE_OPS.get(cbid)
        if op is None:
            return
        device_id, context_id = self.ids.context(context) if context else (0, 0)
        stream_id = module_id = crc = size = 0
        if cbid in (3, 4):
            stream_id = self.ids.stream(context, res.stream or 0)
        elif cbid in (6, 7) and res.descriptor:
            module_id, size, cubin = module_data(res.descriptor)
            if cubin and size:
                crc = self.ids.cubin_crc(cubin, size)
        self._put((_RESOURCE, op, now, device_id, context_id, stream_id, module_id, crc, size))

    def _graph(self, cbid: int, now: int, descriptor: int | None) -> None:
        if not descriptor:
            return
        g = _GraphData.from_address(descriptor)
        ids = self.ids
        node_id = original = 0
        node_type = -1
        if cbid in (13, 14, 20):  # node created, destroyed, cloned
            node_id, node_type = ids.node(g.node or 0), g.nodeType
            original = ids.node(g.originalNode or 0) if cbid == 20 else 0
        self._put((_GRAPH, _GRAPH_OPS[cbid], now, ids.graph(g.graph or 0), node_id, node_type, original))

    def on_synchronize(self, domain: int, cbid: int, data: Any) -> None:
        address = address_of(data)
        if not address:
            return
        now = self.ids.now()
        sync = _SynchronizeData.from_address(address)
        context = sync.context or 0
        _, context_id = self.ids.context(context) if context else (0, 0)
        stream_id = self.ids.stream(context, sync.stream or 0) if cbid == 1 else 0
        self._put((_SYNC, _SYNC_TYPES.get(cbid, str(cbid)), now, context_id, stream_id))

    # NVTX -----------------------------------------------------------------------------------------

    def on_nvtx(self, domain: int, cbid: int, data: Any) -> None:
        handler = self._nvtx.get(cbid)
        address = address_of(data)
        if handler is not None and address:
            info = _NvtxData.from_address(address)
            params = info.functionParams or 0
            if params or cbid == _NVTX_POP:  # every other handled function has parameters
                handler(params, info.functionReturnValue or 0)

    def _attributes(self, attrib: int) -> tuple[str, int, int | None, int | float | None]:
        """(message, category, colour, payload) of an ``nvtxEventAttributes_t``."""
        if not attrib:
            return "", 0, None, None
        a = EventAttributes.from_address(attrib)
        if a.messageType == _MESSAGE_ASCII:
            name = _text(a.message or 0)
        elif a.messageType == _MESSAGE_UNICODE:
            name = _text(a.message or 0, wide=True)
        elif a.messageType == _MESSAGE_REGISTERED:
            name = self.strings.get(a.message or 0, "")
        else:
            name = ""
        color = a.color if a.colorType == _COLOR_ARGB else None
        field = _PAYLOAD_FIELDS.get(a.payloadType)
        payload = getattr(a.payload, field) if field else None
        return name, a.category, color, payload

    def _stack(self, nvtx_domain: int) -> list[tuple[Any, ...]]:
        stacks = getattr(self._local, "stacks", None)
        if stacks is None:
            stacks = self._local.stacks = {}
        return stacks.setdefault(nvtx_domain, [])

    def _push(
        self, nvtx_domain: int, name: str, category: int = 0, color: Any = None, payload: Any = None
    ) -> None:
        self._stack(nvtx_domain).append((name, self.ids.now(), nvtx_domain, category, color, payload))

    def _pop_range(self, nvtx_domain: int) -> None:
        now = self.ids.now()
        stack = self._stack(nvtx_domain)
        if stack:  # a pop without a push (pushed before we subscribed) is ignored
            name, start, dom, category, color, payload = stack.pop()
            tid = threading.get_native_id()
            self._put((_RANGE, name, start, now, tid, len(stack), dom, category, color, payload, 0))

    def _start(self, range_id: int, nvtx_domain: int, name: str, category: int = 0, color: Any = None,
               payload: Any = None) -> None:  # fmt: skip
        if range_id:
            self._started[range_id] = (name, self.ids.now(), nvtx_domain, category, color, payload)

    def _finish(self, range_id: int) -> None:
        now = self.ids.now()
        started = self._started.pop(range_id, None)
        if started is not None:
            name, start, dom, category, color, payload = started
            tid = threading.get_native_id()
            self._put((_RANGE, name, start, now, tid, 0, dom, category, color, payload, range_id))

    def _mark(
        self, nvtx_domain: int, name: str, category: int = 0, color: Any = None, payload: Any = None
    ) -> None:
        self._put(
            (_MARK, name, self.ids.now(), threading.get_native_id(), nvtx_domain, category, color, payload)
        )

    # One small method per NVTX function: ``params`` points at its ``nvtx*_params`` struct.
    def _mark_a(self, params: int, ret: int) -> None:
        self._mark(0, _text(_void_at(params)))

    def _mark_w(self, params: int, ret: int) -> None:
        self._mark(0, _text(_void_at(params), wide=True))

    def _mark_ex(self, params: int, ret: int) -> None:
        self._mark(0, *self._attributes(_void_at(params)))

    def _start_a(self, params: int, ret: int) -> None:
        self._start(ctypes.c_uint64.from_address(ret).value if ret else 0, 0, _text(_void_at(params)))

    def _start_w(self, params: int, ret: int) -> None:
        range_id = ctypes.c_uint64.from_address(ret).value if ret else 0
        self._start(range_id, 0, _text(_void_at(params), wide=True))

    def _start_ex(self, params: int, ret: int) -> None:
        range_id = ctypes.c_uint64.from_address(ret).value if ret else 0
        self._start(range_id, 0, *self._attributes(_void_at(params)))

    def _end(self, params: int, ret: int) -> None:
        self._finish(ctypes.c_uint64.from_address(params).value)

    def _push_a(self, params: int, ret: int) -> None:
        self._push(0, _text(_void_at(params)))

    def _push_w(self, params: int, ret: int) -> None:
        self._push(0, _text(_void_at(params), wide=True))

    def _push_ex(self, params: int, ret: int) -> None:
        self._push(0, *self._attributes(_void_at(params)))

    def _pop(self, params: int, ret: int) -> None:
        self._pop_range(0)

    def _domain_mark(self, params: int, ret: int) -> None:
        self._mark(_void_at(params), *self._attributes(_void_at(params + 8)))

    def _domain_start(self, params: int, ret: int) -> None:
        range_id = ctypes.c_uint64.from_address(ret).value if ret else 0
        self._start(range_id, _void_at(params), *self._attributes(_void_at(params + 8)))

    def _domain_end(self, params: int, ret: int) -> None:
        self._finish(ctypes.c_uint64.from_address(params + 8).value)

    def _domain_push(self, params: int, ret: int) -> None:
        self._push(_void_at(params), *self._attributes(_void_at(params + 8)))

    def _domain_pop(self, params: int, ret: int) -> None:
        self._pop_range(_void_at(params))

    def _domain_create(self, params: int, ret: int, wide: bool = False) -> None:
        handle = _void_at(ret) if ret else 0
        if handle:
            self.domain_names[handle] = _text(_void_at(params), wide)

    def _domain_create_w(self, params: int, ret: int) -> None:
        self._domain_create(params, ret, wide=True)

    def _register_string(self, params: int, ret: int, wide: bool = False) -> None:
        handle = _void_at(ret) if ret else 0
        if handle:
            self.strings[handle] = _text(_void_at(params + 8), wide)

    def _register_string_w(self, params: int, ret: int) -> None:
        self._register_string(params, ret, wide=True)

    # the worker side ------------------------------------------------------------------------------

    def take(self, limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` records, oldest first (thread-safe against concurrent appends)."""
        records = self.records
        out = []
        popleft = records.popleft
        for _ in range(min(limit, len(records))):
            out.append(popleft())
        return out


class EventBuilder:
    """Turns recorded tuples into events, off the application's threads."""

    def __init__(self, recorder: Recorder, api_names: dict[tuple[int, int], str]) -> None:
        self.recorder = recorder
        self.api_names = api_names
        self.pid = os.getpid()

    def build(self, records: Iterable[tuple[Any, ...]]) -> list[Event]:
        events: list[Event] = []
        domains = self.recorder.domain_names
        for r in records:
            tag = r[0]
            if tag == _RANGE:
                _, name, start, end, tid, depth, dom, category, color, payload, range_id = r
                events.append(
                    NvtxRange(
                        name=name, start=start, end=end, thread_id=tid, range_id=range_id, depth=depth,
                        domain=domains.get(dom, ""), category=category, color=color, payload=payload,
                    )
                )  # fmt: skip
            elif tag == _API:
                _, domain, cbid, start, end, tid, corr, status = r
                events.append(
                    ApiCall(
                        domain="runtime" if domain == Domain.RUNTIME_API else "driver",
                        name=self.api_names.get((domain, cbid), f"cbid_{cbid}"), cbid=cbid, start=start,
                        end=end, process_id=self.pid, thread_id=tid, correlation_id=corr, return_value=status,
                    )
                )  # fmt: skip
            elif tag == _MARK:
                _, name, ts, tid, dom, category, color, payload = r
                events.append(
                    NvtxMarker(
                        name=name, timestamp=ts, thread_id=tid, domain=domains.get(dom, ""),
                        category=category, color=color, payload=payload,
                    )
                )  # fmt: skip
            elif tag == _RESOURCE:
                _, op, ts, device_id, context_id, stream_id, module_id, crc, size = r
                events.append(
                    ResourceChange(
                        operation=op, timestamp=ts, device_id=device_id, context_id=context_id,
                        stream_id=stream_id, module_id=module_id, cubin_crc=crc, cubin_size=size,
                    )
                )  # fmt: skip
            elif tag == _GRAPH:
                _, op, ts, graph_id, node_id, node_type, original = r
                kind = "" if node_type < 0 else _graph_node_type(node_type)
                events.append(
                    GraphNode(
                        operation=op, timestamp=ts, graph_id=graph_id, node_id=node_id, node_type=kind,
                        original_node_id=original,
                    )
                )  # fmt: skip
            elif tag == _SYNC:
                _, sync_type, ts, context_id, stream_id = r
                events.append(
                    Synchronization(
                        sync_type=sync_type, start=ts, end=ts, context_id=context_id, stream_id=stream_id,
                        correlation_id=0,
                    )
                )  # fmt: skip
        return events


# --- the source --------------------------------------------------------------------------------


class CallbackSource(Source):
    config_type = CallbacksConfig
    config: CallbacksConfig

    def __init__(self, config: SourceConfig, emitter: Any, *, cupti: Any = None, ids: CuptiIds | None = None,
                 sub: subscriber.Subscriber | None = None) -> None:  # fmt: skip
        super().__init__(config, emitter)
        self._cupti = cupti
        self._ids = ids
        self._subscriber = sub or subscriber.get()
        self._registrations: list[Registration] = []
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._drain_lock = threading.Lock()
        self._reported_drops = 0
        self._reported_handler_errors = 0
        self.recorder: Recorder | None = None

    def start(self) -> None:
        cfg = self.config
        cupti = self._cupti or _import_cupti()
        ids = self._ids or CuptiIds(cupti)
        api_names = self._api_names()
        recorder = self.recorder = Recorder(ids, cfg.max_buffered)
        self._builder = EventBuilder(recorder, api_names)
        if "nvtx" in cfg.domains and cfg.nvtx_injection:
            enable_nvtx_injection()
        wanted: list[tuple[int, Callable[[int, int, Any], None], int | None]] = []
        if "resource" in cfg.domains:  # only the cbids it turns into events, not the whole domain
            wanted += [(Domain.RESOURCE, recorder.on_resource, cbid) for cbid in sorted(RESOURCE_CBIDS)]
        if "synchronize" in cfg.domains:
            wanted.append((Domain.SYNCHRONIZE, recorder.on_synchronize, None))
        if "nvtx" in cfg.domains:
            wanted.append((Domain.NVTX, recorder.on_nvtx, None))
        wanted += [(domain, recorder.on_api, cbid) for domain, cbid in sorted(api_names)]
        try:
            for domain_id, handler, one in wanted:
                self._registrations.append(self._subscriber.register(domain_id, handler, one))
        except BaseException:
            self._unregister()
            raise
        self.clock = ids.now
        self._thread = threading.Thread(target=self._run, name=f"cuptistream-{self.name}", daemon=True)
        self._thread.start()

    def _api_names(self) -> dict[tuple[int, int], str]:
        """(domain, cbid) → function name of every API function to trace."""
        cfg = self.config
        names: dict[tuple[int, int], str] = {}
        for domain_name, domain, patterns in (
            ("runtime", Domain.RUNTIME_API, cfg.runtime_api),
            ("driver", Domain.DRIVER_API, cfg.driver_api),
        ):
            if domain_name in cfg.domains:
                all_names = api_functions.api_names(domain_name)
                for cbid in api_functions.select_cbids(domain_name, patterns):
                    names[(int(domain), cbid)] = all_names[cbid]
        return names

    def _run(self) -> None:
        while not self._stopping.wait(self.config.flush_interval):
            self.flush()

    def flush(self) -> None:
        """Hand everything recorded so far to the emitter. Never raises: failures become Error events."""
        recorder = self.recorder
        if recorder is None:
            return
        with self._drain_lock:
            try:
                while True:
                    records = recorder.take(self.config.chunk_events)
                    if not records:
                        break
                    self.emitter.emit(self._builder.build(records))
                self._report_counts(recorder)
            except Exception as error:
                self.emitter.report_error(f"source:{self.name}", f"callback worker failed: {error}")

    def _report_counts(self, recorder: Recorder) -> None:
        dropped = recorder.dropped
        if dropped > self._reported_drops:
            self.emitter.report_loss(f"source:{self.name}", "buffer_full", dropped - self._reported_drops)
            self._reported_drops = dropped
        errors = self._subscriber.handler_errors()
        if errors > self._reported_handler_errors:
            self.emitter.report_error(
                f"source:{self.name}",
                f"{errors - self._reported_handler_errors} CUPTI callback(s) failed and were skipped; "
                f"first: {self._subscriber.last_handler_error()}",
            )
            self._reported_handler_errors = errors

    def _unregister(self) -> None:
        for reg in self._registrations:
            reg.remove()
        self._registrations.clear()

    def stop(self) -> None:
        self._unregister()  # no callbacks after this, so the last drain is complete
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()


def _import_cupti() -> Any:
    from cuptistream.cupti.subscriber import CuptiUnavailable

    try:
        from cupti import cupti
    except ImportError as error:
        raise CuptiUnavailable(
            f"cupti-python is not installed ({error}); `pip install cupti-python`"
        ) from None
    return cupti
