"""Decoding whole activity buffers into events, in bulk, off CUPTI's thread.

A buffer is a run of packed records, each starting with its ``CUpti_ActivityKind``. Decoding:

1. *Walk*: read each record's kind and step by that kind's record size, collecting offsets per kind
   (one cheap loop over 4-byte ints; no per-record objects).
2. *Gather*: view each kind's records as one numpy structured array (cupti-python's dtypes).
3. *Convert*: turn columns into event Structs, resolving each distinct name pointer once.

Steps 1 and 2 (and the record layouts they need) are ``records``; this module converts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuptistream.codec import Chunk, encode_chunk
from cuptistream.cupti.api_functions import api_names
from cuptistream.cupti.columnar import Packer, group_by
from cuptistream.cupti.kinds import BY_VALUE
from cuptistream.cupti.names import Names, demangle
from cuptistream.cupti.records import (
    RecordLayouts,
    SizeLearner,
    gather,
    walk,
)
from cuptistream.events import (
    Activity,
    ApiCall,
    CudaEvent,
    Device,
    Environment,
    Event,
    ExternalCorrelation,
    GraphLaunch,
    Jit,
    Kernel,
    Memcpy,
    MemoryAllocation,
    MemoryPool,
    Memset,
    NvtxMarker,
    NvtxRange,
    Overhead,
    ResourceChange,
    Synchronization,
    UnifiedMemory,
)

# --- enum names ---------------------------------------------------------------------------------

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


def _name(table: list[str], value: int) -> str:
    return table[value] if 0 <= value < len(table) else str(value)


def _col(records: np.ndarray, name: str, default: int = 0) -> list[Any]:
    if records.dtype.names and name in records.dtype.names:
        return records[name].tolist()
    return [default] * len(records)


def _arr(records: np.ndarray, name: str) -> np.ndarray:
    if records.dtype.names and name in records.dtype.names:
        return records[name]
    return np.zeros(len(records), dtype=np.int64)


_GRAPH = ["graph_id", "graph_node_id"]
_KERNEL_PACKER = Packer(
    "kernel",
    ["start", "end", "device_id", "context_id", "stream_id", "correlation_id", "registers_per_thread",
     "static_shared_bytes", "dynamic_shared_bytes", "local_memory_per_thread", *_GRAPH],
    triples=["grid", "block"], strings=["name"],
)  # fmt: skip
_MEMCPY_INTS = ["start", "end", "bytes", "device_id", "context_id", "stream_id", "correlation_id", *_GRAPH]
_MEMCPY_PACKERS = {
    False: Packer("memcpy", _MEMCPY_INTS, strings=["copy_kind", "src_kind", "dst_kind"]),
    True: Packer("memcpy", [*_MEMCPY_INTS, "src_device_id", "dst_device_id"],
                 strings=["copy_kind", "src_kind", "dst_kind"]),
}  # fmt: skip
_MEMSET_PACKER = Packer(
    "memset",
    ["start", "end", "bytes", "value", "device_id", "context_id", "stream_id", "correlation_id", *_GRAPH],
    strings=["memory_kind"],
)  # fmt: skip
_API_PACKER = Packer(
    "api", ["cbid", "start", "end", "process_id", "thread_id", "correlation_id", "return_value"],
    strings=["domain", "name"],
)  # fmt: skip
_EVENTS_PER_CHUNK = 8192


# --- the decoder --------------------------------------------------------------------------------


@dataclass
class _OpenRange:
    name: str
    start: int
    thread_id: int
    depth: int
    domain: str


class Decoder:
    """Turns activity buffers into events. One per session; not thread-safe (one decode thread).

    Marker START and END records are paired into ``NvtxRange`` events across buffers; ``depth``
    is how many ranges were open on the same thread when the range started.
    """

    def __init__(
        self, names: Names, layouts: RecordLayouts | None = None, demangle_names: bool = False
    ) -> None:
        self.names = names
        self.layouts = layouts or RecordLayouts()
        self.demangle = demangle_names
        self.records_decoded = 0
        self.unknown_kinds: dict[int, int] = {}
        self.device_ids: set[int] = set()  # device ordinals the records named (attribution)
        self._open_ranges: dict[int, _OpenRange] = {}
        self._open_per_thread: dict[int, int] = {}
        self._converters: dict[str, Callable[[int, np.ndarray], list[Event]]] = {
            "kernel": self._kernels, "memcpy": self._memcpys, "memset": self._memsets, "api": self._api,
            "nvtx_range": self._markers, "synchronization": self._syncs, "cuda_event": self._cuda_events,
            "memory": self._memory, "memory_pool": self._memory_pools, "unified_memory": self._um,
            "environment": self._environment, "resource": self._resources, "device": self._devices,
            "jit": self._jit, "overhead": self._overheads, "graph_launch": self._graph_launches,
            "external_correlation": self._external,
        }  # fmt: skip
        self._packers: dict[str, Callable[[int, np.ndarray], bytes]] = {
            "kernel": self._pack_kernels, "memcpy": self._pack_memcpys, "memset": self._pack_memsets,
            "api": self._pack_api,
        }  # fmt: skip

    def decode(self, data: memoryview | bytes, valid: int, learn: SizeLearner | None = None) -> list[Event]:
        """Every event in one buffer. Raises ``LayoutError`` if the buffer cannot be walked."""
        events: list[Event] = []
        for kind, event, records in self._records(data, valid, learn):
            events.extend(self._converters.get(event, self._generic)(kind, records))
        return events

    def decode_packed(
        self, data: memoryview | bytes, valid: int, learn: SizeLearner | None = None
    ) -> list[Chunk]:
        """Every event in one buffer, already encoded: the hot kinds without a Struct per record
        (``columnar``), the others from their events. Same events as ``decode``, grouped."""
        chunks: list[Chunk] = []
        for kind, event, records in self._records(data, valid, learn):
            pack = None if self.demangle and event == "kernel" else self._packers.get(event)
            for lo in range(0, len(records), _EVENTS_PER_CHUNK):
                part = records[lo : lo + _EVENTS_PER_CHUNK]
                if pack is not None:
                    chunks.append(Chunk(pack(kind, part), len(part)))
                elif events := self._converters.get(event, self._generic)(kind, part):
                    chunks.append(encode_chunk(events))
        return chunks

    def _records(
        self, data: memoryview | bytes, valid: int, learn: SizeLearner | None
    ) -> list[tuple[int, str, np.ndarray]]:
        """(kind, event type, records as a structured array) per kind in the buffer."""
        view = memoryview(data).cast("B")
        out: list[tuple[int, str, np.ndarray]] = []
        for kind, offsets in walk(view, valid, self.layouts, learn).items():
            spec = BY_VALUE.get(kind)
            chosen = self.layouts.dtype(kind)
            if spec is None or chosen is None:
                self.unknown_kinds[kind] = self.unknown_kinds.get(kind, 0) + len(offsets)
                continue
            records = gather(view, offsets, chosen[1])
            if "device_id" in (records.dtype.names or ()) and spec.event != "device":
                self.device_ids.update(np.unique(records["device_id"]).tolist())
            out.append((kind, spec.event, records))
            self.records_decoded += len(offsets)
        return out

    # --- packed converters: columns in, msgpack elements out ------------------------------------

    def _pack_kernels(self, kind: int, r: np.ndarray) -> bytes:
        groups, first = group_by(r["name"])
        names = [(self.names(int(p)),) for p in r["name"][first].tolist()]
        ints = {
            "start": r["start"], "end": r["end"], "device_id": r["device_id"], "context_id": r["context_id"],
            "stream_id": r["stream_id"], "correlation_id": r["correlation_id"],
            "registers_per_thread": r["registers_per_thread"],
            "static_shared_bytes": r["static_shared_memory"],
            "dynamic_shared_bytes": r["dynamic_shared_memory"],
            "local_memory_per_thread": r["local_memory_per_thread"], "graph_id": _arr(r, "graph_id"),
            "graph_node_id": _arr(r, "graph_node_id"),
        }  # fmt: skip
        triples = {
            "grid": (r["grid_x"], r["grid_y"], r["grid_z"]),
            "block": (r["block_x"], r["block_y"], r["block_z"]),
        }
        return _KERNEL_PACKER.pack(ints, triples, groups, names)

    def _pack_memcpys(self, kind: int, r: np.ndarray) -> bytes:
        peer = "src_device_id" in (r.dtype.names or ())
        groups, first = group_by(r["copy_kind"], r["src_kind"], r["dst_kind"])
        strings = [
            (_name(COPY_KINDS, int(ck)), _name(MEMORY_KINDS, int(sk)), _name(MEMORY_KINDS, int(dk)))
            for ck, sk, dk in zip(r["copy_kind"][first].tolist(), r["src_kind"][first].tolist(),
                                  r["dst_kind"][first].tolist(), strict=True)
        ]  # fmt: skip
        ints = {name: _arr(r, name) for name in _MEMCPY_INTS}
        if peer:
            ints |= {"src_device_id": r["src_device_id"], "dst_device_id": r["dst_device_id"]}
        return _MEMCPY_PACKERS[peer].pack(ints, {}, groups, strings)

    def _pack_memsets(self, kind: int, r: np.ndarray) -> bytes:
        groups, first = group_by(r["memory_kind"])
        strings = [(_name(MEMORY_KINDS, int(mk)),) for mk in r["memory_kind"][first].tolist()]
        ints = {name: _arr(r, name) for name in _MEMSET_PACKER.ints}
        return _MEMSET_PACKER.pack(ints, {}, groups, strings)

    def _pack_api(self, kind: int, r: np.ndarray) -> bytes:
        domain = {4: "driver", 5: "runtime"}.get(kind, "internal")
        table = api_names(domain) if domain != "internal" else {}
        groups, first = group_by(r["cbid"])
        strings = [(domain, table.get(cbid) or f"cbid_{cbid}") for cbid in r["cbid"][first].tolist()]
        ints = {name: r[name] for name in _API_PACKER.ints}
        return _API_PACKER.pack(ints, {}, groups, strings)

    # --- per-kind converters: columns in, Structs out ------------------------------------------

    def _kernels(self, kind: int, r: np.ndarray) -> list[Event]:
        names = [self.names(p) for p in r["name"].tolist()]
        demangled = [demangle(n) for n in names] if self.demangle else [None] * len(names)
        cols = zip(
            r["start"].tolist(), r["end"].tolist(), names, demangled, r["device_id"].tolist(),
            r["context_id"].tolist(), r["stream_id"].tolist(), r["correlation_id"].tolist(),
            r["grid_x"].tolist(), r["grid_y"].tolist(), r["grid_z"].tolist(),
            r["block_x"].tolist(), r["block_y"].tolist(), r["block_z"].tolist(),
            r["registers_per_thread"].tolist(), r["static_shared_memory"].tolist(),
            r["dynamic_shared_memory"].tolist(), r["local_memory_per_thread"].tolist(),
            _col(r, "graph_id"), _col(r, "graph_node_id"), strict=True,
        )  # fmt: skip
        return [
            Kernel(
                start=s, end=e, name=n, demangled_name=d if d != n else None, device_id=dev,
                context_id=ctx, stream_id=st, correlation_id=c, grid=(gx, gy, gz), block=(bx, by, bz),
                registers_per_thread=regs, static_shared_bytes=ssm, dynamic_shared_bytes=dsm,
                local_memory_per_thread=lm, graph_id=g, graph_node_id=gn,
            )
            for s, e, n, d, dev, ctx, st, c, gx, gy, gz, bx, by, bz, regs, ssm, dsm, lm, g, gn in cols
        ]  # fmt: skip

    def _memcpys(self, kind: int, r: np.ndarray) -> list[Event]:
        peer = "src_device_id" in (r.dtype.names or ())
        cols = zip(
            r["start"].tolist(), r["end"].tolist(), r["bytes"].tolist(), r["copy_kind"].tolist(),
            r["src_kind"].tolist(), r["dst_kind"].tolist(), r["device_id"].tolist(),
            r["context_id"].tolist(), r["stream_id"].tolist(), r["correlation_id"].tolist(),
            _col(r, "src_device_id"), _col(r, "dst_device_id"), _col(r, "graph_id"),
            _col(r, "graph_node_id"), strict=True,
        )  # fmt: skip
        return [
            Memcpy(
                start=s, end=e, bytes=b, copy_kind=_name(COPY_KINDS, ck), src_kind=_name(MEMORY_KINDS, sk),
                dst_kind=_name(MEMORY_KINDS, dk), device_id=dev, context_id=ctx, stream_id=st,
                correlation_id=c, src_device_id=sd if peer else None, dst_device_id=dd if peer else None,
                graph_id=g, graph_node_id=gn,
            )
            for s, e, b, ck, sk, dk, dev, ctx, st, c, sd, dd, g, gn in cols
        ]  # fmt: skip

    def _memsets(self, kind: int, r: np.ndarray) -> list[Event]:
        cols = zip(
            r["start"].tolist(), r["end"].tolist(), r["bytes"].tolist(), r["value"].tolist(),
            r["memory_kind"].tolist(), r["device_id"].tolist(), r["context_id"].tolist(),
            r["stream_id"].tolist(), r["correlation_id"].tolist(), _col(r, "graph_id"),
            _col(r, "graph_node_id"), strict=True,
        )  # fmt: skip
        return [
            Memset(
                start=s, end=e, bytes=b, value=v, memory_kind=_name(MEMORY_KINDS, mk), device_id=dev,
                context_id=ctx, stream_id=st, correlation_id=c, graph_id=g, graph_node_id=gn,
            )
            for s, e, b, v, mk, dev, ctx, st, c, g, gn in cols
        ]  # fmt: skip

    def _api(self, kind: int, r: np.ndarray) -> list[Event]:
        domain = {4: "driver", 5: "runtime"}.get(kind, "internal")
        table = api_names(domain) if domain != "internal" else {}
        cols = zip(
            r["cbid"].tolist(), r["start"].tolist(), r["end"].tolist(), r["process_id"].tolist(),
            r["thread_id"].tolist(), r["correlation_id"].tolist(), r["return_value"].tolist(), strict=True,
        )  # fmt: skip
        return [
            ApiCall(
                domain=domain, name=table.get(cbid) or f"cbid_{cbid}", cbid=cbid, start=s, end=e,
                process_id=pid, thread_id=tid, correlation_id=c, return_value=rv,
            )
            for cbid, s, e, pid, tid, c, rv in cols
        ]  # fmt: skip

    def _markers(self, kind: int, r: np.ndarray) -> list[Event]:
        events: list[Event] = []
        threads = r["object_id"]["pt"]["thread_id"].tolist()
        cols = zip(
            r["flags_"].tolist(), r["timestamp"].tolist(), r["id"].tolist(), r["name"].tolist(),
            r["domain"].tolist(), threads, strict=True,
        )  # fmt: skip
        for flags, ts, range_id, name_ptr, domain_ptr, thread in cols:
            if flags & MARKER_START:
                depth = self._open_per_thread.get(thread, 0)
                self._open_per_thread[thread] = depth + 1
                self._open_ranges[range_id] = _OpenRange(
                    self.names(name_ptr), ts, thread, depth, self.names(domain_ptr)
                )
            elif flags & MARKER_END:
                opened = self._open_ranges.pop(range_id, None)
                if opened is None:  # started before this session attached
                    continue
                self._open_per_thread[opened.thread_id] -= 1
                events.append(
                    NvtxRange(
                        name=opened.name, start=opened.start, end=ts, thread_id=opened.thread_id,
                        range_id=range_id, depth=opened.depth, domain=opened.domain,
                    )
                )  # fmt: skip
            else:  # instantaneous marker
                name, domain = self.names(name_ptr), self.names(domain_ptr)
                events.append(NvtxMarker(name=name, timestamp=ts, thread_id=thread, domain=domain))
        return events

    def _syncs(self, kind: int, r: np.ndarray) -> list[Event]:
        cols = zip(
            r["type"].tolist(), r["start"].tolist(), r["end"].tolist(), r["context_id"].tolist(),
            r["stream_id"].tolist(), r["correlation_id"].tolist(), r["cuda_event_id"].tolist(), strict=True,
        )  # fmt: skip
        return [
            Synchronization(
                sync_type=_name(SYNC_TYPES, t), start=s, end=e, context_id=ctx, stream_id=st,
                correlation_id=c, cuda_event_id=ev,
            )
            for t, s, e, ctx, st, c, ev in cols
        ]  # fmt: skip

    def _cuda_events(self, kind: int, r: np.ndarray) -> list[Event]:
        cols = zip(
            r["event_id"].tolist(), r["context_id"].tolist(), r["stream_id"].tolist(),
            r["correlation_id"].tolist(), _col(r, "device_timestamp"), strict=True,
        )  # fmt: skip
        return [
            CudaEvent(event_id=ev, context_id=ctx, stream_id=st, correlation_id=c, device_timestamp=ts)
            for ev, ctx, st, c, ts in cols
        ]

    def _memory(self, kind: int, r: np.ndarray) -> list[Event]:
        sources = [self.names(p) for p in _col(r, "source")]
        cols = zip(
            r["memory_operation_type"].tolist(), r["timestamp"].tolist(), r["address"].tolist(),
            r["bytes"].tolist(), r["memory_kind"].tolist(), r["device_id"].tolist(), r["context_id"].tolist(),
            r["stream_id"].tolist(), r["correlation_id"].tolist(), sources, strict=True,
        )  # fmt: skip
        return [
            MemoryAllocation(
                operation=_name(MEMORY_OPS, op), timestamp=ts, address=a, bytes=b,
                memory_kind=_name(MEMORY_KINDS, mk), device_id=dev, context_id=ctx, stream_id=st,
                correlation_id=c, source=src,
            )
            for op, ts, a, b, mk, dev, ctx, st, c, src in cols
        ]  # fmt: skip

    def _memory_pools(self, kind: int, r: np.ndarray) -> list[Event]:
        cols = zip(
            r["memory_pool_operation_type"].tolist(), r["timestamp"].tolist(), r["address"].tolist(),
            r["memory_pool_type"].tolist(), r["size_"].tolist(), r["release_threshold"].tolist(),
            r["device_id"].tolist(), _col(r, "utilized_size"), r["correlation_id"].tolist(), strict=True,
        )  # fmt: skip
        return [
            MemoryPool(
                operation=_name(POOL_OPS, op), timestamp=ts, address=a, pool_type=_name(POOL_TYPES, pt),
                size=sz, release_threshold=rt, device_id=dev, utilized_size=u, correlation_id=c,
            )
            for op, ts, a, pt, sz, rt, dev, u, c in cols
        ]  # fmt: skip

    def _um(self, kind: int, r: np.ndarray) -> list[Event]:
        cols = zip(
            r["counter_kind"].tolist(), r["start"].tolist(), r["end"].tolist(), r["value"].tolist(),
            r["address"].tolist(), r["src_id"].tolist(), r["dst_id"].tolist(), r["process_id"].tolist(),
            strict=True,
        )  # fmt: skip
        return [
            UnifiedMemory(
                counter=_name(UM_COUNTERS, k), start=s, end=e, value=v, address=a, src_id=si, dst_id=di,
                process_id=pid,
            )
            for k, s, e, v, a, si, di, pid in cols
        ]  # fmt: skip

    def _environment(self, kind: int, r: np.ndarray) -> list[Event]:
        events: list[Event] = []
        data = r["data_"]
        for i, (env_kind, dev, ts) in enumerate(
            zip(r["environment_kind"].tolist(), r["device_id"].tolist(), r["timestamp"].tolist(), strict=True)
        ):
            event = Environment(device_id=dev, timestamp=ts)
            if env_kind == 1:
                speed = data["speed"][i]
                event.sm_clock_mhz = int(speed["sm_clock"])
                event.memory_clock_mhz = int(speed["memory_clock"])
                event.throttle_reasons = int(speed["clocks_throttle_reasons"])
            elif env_kind == 2:
                event.temperature_c = int(data["temperature"][i]["gpu_temperature"])
            elif env_kind == 3:
                event.power_mw = int(data["power"][i]["power"])
                event.power_limit_mw = int(data["power"][i]["power_limit"])
            elif env_kind == 4:
                event.fan_speed_percent = int(data["cooling"][i]["fan_speed"])
            events.append(event)
        return events

    def _resources(self, kind: int, r: np.ndarray) -> list[Event]:
        operation = "context" if kind == 9 else "stream"
        cols = zip(_col(r, "device_id"), r["context_id"].tolist(), _col(r, "stream_id"), strict=True)
        return [
            ResourceChange(operation=operation, timestamp=0, device_id=dev, context_id=ctx, stream_id=st)
            for dev, ctx, st in cols
        ]

    def _devices(self, kind: int, r: np.ndarray) -> list[Event]:
        events: list[Event] = []
        for i, (dev, name_ptr) in enumerate(zip(r["id"].tolist(), r["name"].tolist(), strict=True)):
            uuid = bytes(r["uuid"][i]).hex()
            events.append(
                Device(
                    device_id=dev, name=self.names(name_ptr),
                    uuid=f"GPU-{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}",
                    compute_capability=(
                        int(r["compute_capability_major"][i]), int(r["compute_capability_minor"][i])
                    ),
                    sm_count=int(r["num_multiprocessors"][i]),
                    global_memory_bytes=int(r["global_memory_size"][i]),
                    core_clock_khz=int(r["core_clock_rate"][i]),
                )
            )  # fmt: skip
        return events

    def _jit(self, kind: int, r: np.ndarray) -> list[Event]:
        cols = zip(
            r["jit_operation_type"].tolist(), r["start"].tolist(), r["end"].tolist(), r["device_id"].tolist(),
            r["correlation_id"].tolist(), r["cache_path"].tolist(), r["cache_size"].tolist(), strict=True,
        )  # fmt: skip
        return [
            Jit(
                operation=_name(JIT_OPS, op), start=s, end=e, device_id=dev, correlation_id=c,
                cache_path=self.names(path), cache_size=size,
            )
            for op, s, e, dev, c, path, size in cols
        ]  # fmt: skip

    def _overheads(self, kind: int, r: np.ndarray) -> list[Event]:
        object_kinds = r["object_kind"].tolist()
        thread_ids = r["object_id"]["pt"]["thread_id"].tolist()
        device_ids = r["object_id"]["dcs"]["device_id"].tolist()
        cols = zip(r["overhead_kind"].tolist(), object_kinds, thread_ids, device_ids, r["start"].tolist(),
                   r["end"].tolist(), strict=True)  # fmt: skip
        return [
            Overhead(
                overhead_kind=OVERHEAD_KINDS.get(ok, str(ok)), object_kind=_name(OBJECT_KINDS, obk),
                object_id=tid if obk in (1, 2) else did, start=s, end=e,
            )
            for ok, obk, tid, did, s, e in cols
        ]  # fmt: skip

    def _graph_launches(self, kind: int, r: np.ndarray) -> list[Event]:
        cols = zip(
            r["start"].tolist(), r["end"].tolist(), r["graph_id"].tolist(), r["device_id"].tolist(),
            r["context_id"].tolist(), r["stream_id"].tolist(), r["correlation_id"].tolist(), strict=True,
        )  # fmt: skip
        return [
            GraphLaunch(
                start=s, end=e, graph_id=g, device_id=dev, context_id=ctx, stream_id=st, correlation_id=c
            )
            for s, e, g, dev, ctx, st, c in cols
        ]

    def _external(self, kind: int, r: np.ndarray) -> list[Event]:
        cols = zip(
            r["external_kind"].tolist(), r["external_id"].tolist(), r["correlation_id"].tolist(), strict=True
        )
        return [
            ExternalCorrelation(external_kind=_name(EXTERNAL_KINDS, k), external_id=x, correlation_id=c)
            for k, x, c in cols
        ]

    def _generic(self, kind: int, r: np.ndarray) -> list[Event]:
        """Any other kind: every named scalar field as it is; ``name`` pointers resolved."""
        spec = BY_VALUE[kind]
        columns: dict[str, list[Any]] = {}
        for field_name in r.dtype.names or ():
            if field_name == "kind" or field_name.startswith(("pad", "reserved")):
                continue
            sub = r.dtype.fields[field_name][0]  # type: ignore[index]
            if sub.names is not None or sub.subdtype is not None:
                continue  # unions and arrays: not representable generically
            if sub.kind == "V":
                columns[field_name] = [bytes(v).hex() for v in r[field_name]]
            elif field_name == "name":
                columns[field_name] = [self.names(p) for p in r[field_name].tolist()]
            else:
                columns[field_name] = r[field_name].tolist()
        keys = list(columns)
        return [
            Activity(kind=spec.name, fields=dict(zip(keys, values, strict=True)))
            for values in zip(*columns.values(), strict=True)
        ]
