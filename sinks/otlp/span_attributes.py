"""An event's span as a backend shows it: its name, its attributes (the ``cuda.*``, ``nvtx.*`` and
``hw.*`` names of docs/otlp.md, "Traces"), and an error status for a failed API call.

``otlp_traces`` decides which span is whose parent and in which trace; this module only describes
one span at a time.
"""

from __future__ import annotations

from opentelemetry.proto.trace.v1.trace_pb2 import Status

from cuptistream.events import ApiCall, Event, GraphLaunch, Kernel, Memcpy, Memset, NvtxRange, Synchronization

from .common import AttrValue


def _device(devices: dict[int, tuple[str, str]], device_id: int) -> dict[str, AttrValue | None]:
    uuid, name = devices.get(device_id, (None, None))
    return {"cuda.device.id": device_id, "hw.id": uuid, "hw.model": name}


def describe(
    ev: Event, devices: dict[int, tuple[str, str]]
) -> tuple[str, dict[str, AttrValue | None], Status | None]:
    """The span name, attributes and status of ``ev``; ``devices`` maps a device id to its (uuid, name)."""
    if isinstance(ev, Kernel):
        kernel: dict[str, AttrValue | None] = {
            "cuda.kernel.name": ev.name,
            **_xyz("cuda.kernel.grid", ev.grid),
            **_xyz("cuda.kernel.block", ev.block),
            "cuda.kernel.registers_per_thread": ev.registers_per_thread,
            "cuda.kernel.shared_memory.static": ev.static_shared_bytes,
            "cuda.kernel.shared_memory.dynamic": ev.dynamic_shared_bytes,
            "cuda.kernel.local_memory_per_thread": ev.local_memory_per_thread,
        }
        return ev.demangled_name or ev.name, _work("kernel", ev, devices, kernel), None
    if isinstance(ev, Memcpy):
        memcpy: dict[str, AttrValue | None] = {
            "cuda.memcpy.kind": ev.copy_kind,
            "cuda.memcpy.bytes": ev.bytes,
            "cuda.memcpy.src_kind": ev.src_kind,
            "cuda.memcpy.dst_kind": ev.dst_kind,
            "cuda.memcpy.src_device.id": ev.src_device_id,
            "cuda.memcpy.dst_device.id": ev.dst_device_id,
        }
        return f"memcpy {ev.copy_kind}", _work("memcpy", ev, devices, memcpy), None
    if isinstance(ev, Memset):
        memset: dict[str, AttrValue | None] = {
            "cuda.memset.bytes": ev.bytes,
            "cuda.memset.value": ev.value,
            "cuda.memset.memory_kind": ev.memory_kind,
        }
        return "memset", _work("memset", ev, devices, memset), None
    if isinstance(ev, Synchronization):
        return (
            f"sync {ev.sync_type}",
            {
                "cuda.activity.kind": "synchronization",
                **_stream(ev),
                "cuda.sync.type": ev.sync_type,
                "cuda.event.id": ev.cuda_event_id or None,
            },
            None,
        )
    if isinstance(ev, GraphLaunch):
        return (
            "graph launch",
            {
                "cuda.activity.kind": "graph_launch",
                **_device(devices, ev.device_id),
                **_stream(ev),
                "cuda.graph.id": ev.graph_id,
            },
            None,
        )
    if isinstance(ev, ApiCall):
        status = None
        if ev.return_value != 0:
            status = Status(code=Status.STATUS_CODE_ERROR, message=f"{ev.name} returned {ev.return_value}")
        return (
            ev.name,
            {
                "cuda.activity.kind": "api",
                "cuda.api.domain": ev.domain,
                "cuda.api.cbid": ev.cbid,
                "cuda.api.return_value": ev.return_value,
                "cuda.correlation_id": ev.correlation_id,
                "thread.id": ev.thread_id,
            },
            status,
        )
    assert isinstance(ev, NvtxRange)
    return (
        ev.name,
        {
            "cuda.activity.kind": "nvtx",
            "nvtx.domain": ev.domain or None,
            "nvtx.depth": ev.depth,
            "nvtx.category": ev.category or None,
            "nvtx.color": ev.color,
            "nvtx.payload": ev.payload,
            "nvtx.range_id": ev.range_id or None,
            "thread.id": ev.thread_id,
        },
        None,
    )


def _work(
    kind: str,
    ev: Kernel | Memcpy | Memset,
    devices: dict[int, tuple[str, str]],
    attrs: dict[str, AttrValue | None],
) -> dict[str, AttrValue | None]:
    """A kernel's, copy's or memset's attributes: its kind, device and stream, ``attrs``, its graph node."""
    return {
        "cuda.activity.kind": kind,
        **_device(devices, ev.device_id),
        **_stream(ev),
        **attrs,
        **_graph(ev.graph_id, ev.graph_node_id),
    }


def _stream(ev: Kernel | Memcpy | Memset | Synchronization | GraphLaunch) -> dict[str, AttrValue | None]:
    return {
        "cuda.context.id": ev.context_id,
        "cuda.stream.id": ev.stream_id,
        "cuda.correlation_id": ev.correlation_id,
    }


def _graph(graph_id: int, node_id: int) -> dict[str, AttrValue | None]:
    return {"cuda.graph.id": graph_id or None, "cuda.graph.node.id": node_id or None}


def _xyz(prefix: str, dims: tuple[int, int, int]) -> dict[str, AttrValue | None]:
    return {f"{prefix}.x": dims[0], f"{prefix}.y": dims[1], f"{prefix}.z": dims[2]}
