"""CUPTI's callback structs (``cupti_callbacks.h``), NVTX's event attributes (``nvToolsExt.h``), the
cbids the recorder handles, and the tags of the tuples it buffers. Declarations only."""

from __future__ import annotations

import ctypes


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
