"""Activity records → event Structs: one converter per kind, columns in, a Struct per record out.

``decode.Decoder`` walks a buffer and hands each kind's records (a numpy structured array) to the
converter named for its event type; the hot kinds can skip the Structs instead (``packed``). The
converters keep the one piece of state that spans buffers: NVTX ranges still open, so that a START
and its END, often in different buffers, make one ``NvtxRange``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuptistream.cupti.activity_enums import (
    COPY_KINDS,
    EXTERNAL_KINDS,
    JIT_OPS,
    MARKER_END,
    MARKER_START,
    MEMORY_KINDS,
    MEMORY_OPS,
    OBJECT_KINDS,
    OVERHEAD_KINDS,
    POOL_OPS,
    POOL_TYPES,
    SYNC_TYPES,
    UM_COUNTERS,
)
from cuptistream.cupti.activity_enums import enum_name as _name
from cuptistream.cupti.api_functions import api_names
from cuptistream.cupti.kinds import BY_VALUE
from cuptistream.cupti.names import Names, demangle
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


def _col(records: np.ndarray, name: str, default: int = 0) -> list[Any]:
    if records.dtype.names and name in records.dtype.names:
        return records[name].tolist()
    return [default] * len(records)


@dataclass
class _OpenRange:
    name: str
    start: int
    thread_id: int
    depth: int
    domain: str


class StructConverters:
    """The per-kind converters of one session; not thread-safe (one decode thread).

    Marker START and END records are paired into ``NvtxRange`` events across buffers; ``depth``
    is how many ranges were open on the same thread when the range started.
    """

    def __init__(self, names: Names, demangle_names: bool = False) -> None:
        self.names = names
        self.demangle = demangle_names
        self._open_ranges: dict[int, _OpenRange] = {}
        self._open_per_thread: dict[int, int] = {}
        # By event type; a kind not here is converted by ``generic``.
        self.by_event: dict[str, Callable[[int, np.ndarray], list[Event]]] = {
            "kernel": self._kernels, "memcpy": self._memcpys, "memset": self._memsets, "api": self._api,
            "nvtx_range": self._markers, "synchronization": self._syncs, "cuda_event": self._cuda_events,
            "memory": self._memory, "memory_pool": self._memory_pools, "unified_memory": self._um,
            "environment": self._environment, "resource": self._resources, "device": self._devices,
            "jit": self._jit, "overhead": self._overheads, "graph_launch": self._graph_launches,
            "external_correlation": self._external,
        }  # fmt: skip

    def convert(self, event: str, kind: int, records: np.ndarray) -> list[Event]:
        """The events of ``records``, all of one ``kind`` whose event type is ``event``."""
        return self.by_event.get(event, self.generic)(kind, records)

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

    def generic(self, kind: int, r: np.ndarray) -> list[Event]:
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
