"""The callback side: tiny handlers, one per domain, that run on the application's threads inside its
CUDA or NVTX call. Each reads the few fields it needs and appends one plain tuple; when
``max_buffered`` tuples wait, new ones are dropped and counted. A callback never waits."""

from __future__ import annotations

import collections
import ctypes
import threading
from typing import Any

from cuptistream.cupti.contexts import module_data
from cuptistream.cupti.subscriber import API_ENTER as _API_ENTER
from cuptistream.cupti.subscriber import ApiCallbackData as _CallbackData
from cuptistream.cupti.subscriber import address_of

from .ids import CuptiIds
from .structs import (
    _API,
    _COLOR_ARGB,
    _GRAPH,
    _GRAPH_OPS,
    _MARK,
    _MESSAGE_ASCII,
    _MESSAGE_REGISTERED,
    _MESSAGE_UNICODE,
    _NVTX_DOMAIN_CREATE_A,
    _NVTX_DOMAIN_CREATE_W,
    _NVTX_DOMAIN_END,
    _NVTX_DOMAIN_MARK_EX,
    _NVTX_DOMAIN_POP,
    _NVTX_DOMAIN_PUSH_EX,
    _NVTX_DOMAIN_START_EX,
    _NVTX_END,
    _NVTX_MARK_A,
    _NVTX_MARK_EX,
    _NVTX_MARK_W,
    _NVTX_POP,
    _NVTX_PUSH_A,
    _NVTX_PUSH_EX,
    _NVTX_PUSH_W,
    _NVTX_REGISTER_STRING_A,
    _NVTX_REGISTER_STRING_W,
    _NVTX_START_A,
    _NVTX_START_EX,
    _NVTX_START_W,
    _PAYLOAD_FIELDS,
    _RANGE,
    _RESOURCE,
    _RESOURCE_OPS,
    _SYNC,
    _SYNC_TYPES,
    RESOURCE_CBIDS,
    EventAttributes,
    _GraphData,
    _NvtxData,
    _ResourceData,
    _SynchronizeData,
    _text,
    _void_at,
)


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
