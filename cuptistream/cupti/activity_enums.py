"""CUPTI's enum values as the names events carry (``HtoD``, ``pinned``, ``stream_synchronize``, ...).

Both the Struct converters (``convert``) and the packed ones (``packed``) name values through these
tables, so the two paths give the same strings.
"""

from __future__ import annotations

COPY_KINDS = ["unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"]
MEMORY_KINDS = [
    "unknown", "pageable", "pinned", "device", "array", "managed", "device_static", "managed_static",
]  # fmt: skip
SYNC_TYPES = [
    "unknown", "event_synchronize", "stream_wait_event", "stream_synchronize", "context_synchronize",
]  # fmt: skip
MEMORY_OPS = ["invalid", "alloc", "free"]
POOL_OPS = ["invalid", "created", "destroyed", "trimmed"]
POOL_TYPES = ["invalid", "local", "imported"]
JIT_OPS = ["invalid", "cache_load", "cache_store", "compile"]
EXTERNAL_KINDS = ["invalid", "unknown", "openacc", "custom0", "custom1", "custom2"]
OBJECT_KINDS = ["unknown", "process", "thread", "device", "context", "stream"]
UM_COUNTERS = [
    "unknown", "bytes_transfer_htod", "bytes_transfer_dtoh", "cpu_page_fault_count", "gpu_page_fault",
    "thrashing", "throttling", "remote_map", "bytes_transfer_dtod",
]  # fmt: skip
OVERHEAD_KINDS = {
    0: "unknown", 1: "driver_compiler", 1 << 16: "cupti_buffer_flush", 2 << 16: "cupti_instrumentation",
    3 << 16: "cupti_resource", 4 << 16: "runtime_triggered_module_loading", 5 << 16: "lazy_function_loading",
    6 << 16: "command_buffer_full", 7 << 16: "activity_buffer_request", 8 << 16: "uvm_activity_init",
}  # fmt: skip

MARKER_INSTANTANEOUS, MARKER_START, MARKER_END = 1, 2, 4


def enum_name(table: list[str], value: int) -> str:
    return table[value] if 0 <= value < len(table) else str(value)
