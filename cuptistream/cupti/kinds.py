"""Activity kinds by name: their CUPTI enum value, the event type they become, and their record layouts.

``KINDS`` is the table behind ``sources[].kinds`` in YAML and behind ``cuptistream kinds``. The
enum values are CUPTI's ABI (``CUpti_ActivityKind``) and do not change between releases; the record
*layout* does (Kernel9 … Kernel13), so each kind lists the cupti-python dtypes that can describe it,
newest first, and ``records.RecordLayouts`` picks one by the size CUPTI reports for the record.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KindSpec:
    name: str  # the YAML name
    kind: int  # CUpti_ActivityKind
    event: str  # the event type tag it becomes (``activity`` = the generic ``Activity`` event)
    dtypes: tuple[str, ...]  # cupti-python dtype names (``activity_<x>_dtype``), newest first
    note: str = ""


_SPECS = [
    KindSpec("memcpy", 1, "memcpy", ("memcpy7", "memcpy6", "memcpy5")),
    KindSpec("memset", 2, "memset", ("memset5", "memset4")),
    KindSpec("kernel", 3, "kernel", ("kernel13", "kernel12", "kernel11", "kernel10", "kernel9"),
             "serializes kernels; prefer concurrent_kernel"),
    KindSpec("driver", 4, "api", ("api",), "filtered by driver_api"),
    KindSpec("runtime", 5, "api", ("api",), "filtered by runtime_api"),
    KindSpec("device", 8, "device", ("device6", "device5")),
    KindSpec("context", 9, "resource", ("context4", "context3")),
    KindSpec("concurrent_kernel", 10, "kernel", ("kernel13", "kernel12", "kernel11", "kernel10", "kernel9")),
    KindSpec("name", 11, "activity", ("name",), "names given through NVTX"),
    KindSpec("marker", 12, "nvtx_range", ("marker2",), "NVTX; needs NVTX_INJECTION64_PATH"),
    KindSpec("marker_data", 13, "activity", ("marker_data2", "marker_data")),
    KindSpec("overhead", 17, "overhead", ("overhead3",)),
    KindSpec("cdp_kernel", 18, "activity", ("cdp_kernel",)),
    KindSpec("preemption", 19, "activity", ("preemption",)),
    KindSpec("environment", 20, "environment", ("environment",)),
    KindSpec("memcpy2", 22, "memcpy", ("memcpy_pto_p4",), "peer-to-peer copies"),
    KindSpec("unified_memory_counter", 25, "unified_memory",
             ("unified_memory_counter3", "unified_memory_counter2")),
    KindSpec("function", 26, "activity", ("function",)),
    KindSpec("module", 27, "activity", ("module",)),
    KindSpec("device_attribute", 28, "activity", ("device_attribute",)),
    KindSpec("openacc_data", 33, "activity", ("open_acc_data",)),
    KindSpec("openacc_launch", 34, "activity", ("open_acc_launch",)),
    KindSpec("openacc_other", 35, "activity", ("open_acc_other",)),
    KindSpec("cuda_event", 36, "cuda_event", ("cuda_event2", "cuda_event")),
    KindSpec("stream", 37, "resource", ("stream",)),
    KindSpec("synchronization", 38, "synchronization", ("synchronization2", "synchronization")),
    KindSpec("external_correlation", 39, "external_correlation", ("external_correlation",)),
    KindSpec("memory", 45, "activity", ("memory",)),
    KindSpec("openmp", 47, "activity", ("open_mp",)),
    KindSpec("internal_launch_api", 48, "api", ("api",)),
    KindSpec("memory2", 49, "memory", ("memory4",)),
    KindSpec("memory_pool", 50, "memory_pool", ("memory_pool3", "memory_pool2")),
    KindSpec("graph_trace", 51, "graph_launch", ("graph_trace2",)),
    KindSpec("jit", 52, "jit", ("jit2",)),
    KindSpec("device_graph_trace", 53, "activity", ("device_graph_trace",)),
    KindSpec("mem_decompress", 54, "activity", ("mem_decompress",)),
    KindSpec("confidential_compute_rotation", 55, "activity", ("confidential_compute_rotation",)),
    KindSpec("graph_host_node", 56, "activity", ("graph_host_node",)),
    KindSpec("compute_engine_ctx_switch", 57, "activity", ("compute_engine_ctx_switch",)),
    KindSpec("host_launch", 58, "activity", ("host_launch",)),
    KindSpec("green_context", 59, "activity", ("green_context3", "green_context2", "green_context")),
]  # fmt: skip

KINDS: dict[str, KindSpec] = {s.name: s for s in _SPECS}
BY_VALUE: dict[int, KindSpec] = {s.kind: s for s in _SPECS}

DEFAULT_KINDS = [
    "concurrent_kernel", "memcpy", "memset", "runtime", "driver", "marker", "external_correlation",
]  # fmt: skip

# Launch, memcpy, memset and sync calls only: unfiltered API tracing costs several times as much per launch.
DEFAULT_RUNTIME_API = [
    "cudaLaunch*", "cudaGraphLaunch", "cudaMemcpy*", "cudaMemset*", "cuda*Synchronize",
    "cudaStreamWaitEvent",
]  # fmt: skip
DEFAULT_DRIVER_API = [
    "cuLaunch*", "cuGraphLaunch", "cuMemcpy*", "cuMemset*", "cu*Synchronize", "cuStreamWaitEvent",
]  # fmt: skip


def kind_value(name: str) -> int:
    """CUPTI's enum value for a YAML kind name. Raises KeyError for an unknown name."""
    return KINDS[name].kind
