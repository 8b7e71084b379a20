"""The hot kinds' records → msgpack event elements, column by column, without a Struct per record.

Kernels, memory copies and sets, and API calls arrive by the hundred thousand per second;
``decode.Decoder.decode_packed`` encodes them here with ``columnar``'s packers (one layout per group
of records that share their string fields). The strings come from ``activity_enums``, as the
Structs' do, so both paths decode to the same events.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from cuptistream.cupti.activity_enums import COPY_KINDS, MEMORY_KINDS
from cuptistream.cupti.activity_enums import enum_name as _name
from cuptistream.cupti.api_functions import api_names
from cuptistream.cupti.columnar import Allocate, Packer, group_by
from cuptistream.cupti.names import Names


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


class PackedConverters:
    """The packed converters of one session, by event type (``by_event``): kind and records in,
    the events' msgpack elements out, written where ``allocate`` says (None: the heap). With
    ``columns``, one ``events.Columns`` element per call instead of one map per record."""

    def __init__(self, names: Names, columns: bool = False) -> None:
        self.names = names
        self.columns = columns
        self.allocate: Allocate | None = None
        self.by_event: dict[str, Callable[[int, np.ndarray], bytes | memoryview]] = {
            "kernel": self._pack_kernels, "memcpy": self._pack_memcpys, "memset": self._pack_memsets,
            "api": self._pack_api,
        }  # fmt: skip

    def _pack_kernels(self, kind: int, r: np.ndarray) -> bytes | memoryview:
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
        return self._pack(_KERNEL_PACKER, ints, triples, groups, names)

    def _pack_memcpys(self, kind: int, r: np.ndarray) -> bytes | memoryview:
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
        return self._pack(_MEMCPY_PACKERS[peer], ints, {}, groups, strings)

    def _pack_memsets(self, kind: int, r: np.ndarray) -> bytes | memoryview:
        groups, first = group_by(r["memory_kind"])
        strings = [(_name(MEMORY_KINDS, int(mk)),) for mk in r["memory_kind"][first].tolist()]
        ints = {name: _arr(r, name) for name in _MEMSET_PACKER.ints}
        return self._pack(_MEMSET_PACKER, ints, {}, groups, strings)

    def _pack_api(self, kind: int, r: np.ndarray) -> bytes | memoryview:
        domain = {4: "driver", 5: "runtime"}.get(kind, "internal")
        table = api_names(domain) if domain != "internal" else {}
        groups, first = group_by(r["cbid"])
        strings = [(domain, table.get(cbid) or f"cbid_{cbid}") for cbid in r["cbid"][first].tolist()]
        ints = {name: r[name] for name in _API_PACKER.ints}
        return self._pack(_API_PACKER, ints, {}, groups, strings)

    def _pack(
        self,
        packer: Packer,
        ints: Mapping[str, np.ndarray],
        triples: Mapping[str, Sequence[np.ndarray]],
        groups: np.ndarray,
        strings: Sequence[Sequence[str]],
    ) -> bytes | memoryview:
        if self.columns:
            return packer.pack_columns(ints, triples, groups, strings, self.allocate)
        return packer.pack(ints, triples, groups, strings, self.allocate)
