"""What ``cuptistream compare`` reads of a batch: its GPU work, as columns (``GpuWork``).

``DECODER`` decodes a file-sink batch into Structs with only the fields compare needs (kernels,
copies, memsets, the statistics events of ``compare_stats`` and the PmKernelStats of
``compare_hardware``; every other family decodes to an
empty Struct whose fields msgspec skips), so a recording is read faster than the summary reads it.
Batches from Kafka or JSON Lines arrive as the full Structs of ``cuptistream.events`` and take a
slower path with the same result.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import msgspec
import numpy as np

from cuptistream import events as ev
from cuptistream.analysis.aggregate import take, within
from cuptistream.analysis.compare_hardware import HARDWARE, CPmKernelStats, hardware_rows
from cuptistream.analysis.compare_stats import (
    STATS,
    STATS_TAGS,
    CActivityStats,
    CGpuStats,
    StatsWork,
    stats_work,
)
from cuptistream.analysis.records import Part, tag_of
from cuptistream.analysis.select import Selection

NONE, KERNEL, MEMCPY, MEMSET, GRAPH = range(5)
_GPU_OF_TAG = {"kernel": KERNEL, "memcpy": MEMCPY, "memset": MEMSET, "graph_launch": GRAPH}
_GPU_OF_TAG.update(dict.fromkeys(STATS_TAGS, STATS))
_GPU_OF_TAG["pm_kernel_stats"] = HARDWARE


class _C(msgspec.Struct, tag_field="type", kw_only=True, gc=False):
    gpu: ClassVar[int] = NONE


class CKernel(_C, tag="kernel"):
    gpu: ClassVar[int] = KERNEL
    start: int
    end: int
    name: str
    device_id: int
    demangled_name: str | None = None


class CMemcpy(_C, tag="memcpy"):
    gpu: ClassVar[int] = MEMCPY
    start: int
    end: int
    bytes: int
    device_id: int


class CGraphLaunch(_C, tag="graph_launch"):
    """A whole CUDA graph (the ``graph_trace`` kind): compute time under the name ``CUDA graph <id>``."""

    gpu: ClassVar[int] = GRAPH
    start: int
    end: int
    graph_id: int
    device_id: int


class CMemset(_C, tag="memset"):
    gpu: ClassVar[int] = MEMSET
    start: int
    end: int
    bytes: int
    device_id: int


_OTHERS = tuple(
    msgspec.defstruct(f"C_{tag}", [], bases=(_C,), tag=tag, kw_only=True)
    for tag in ev.EVENT_TYPES
    if tag not in _GPU_OF_TAG
)
_UNION = (CKernel, CMemcpy, CMemset, CGraphLaunch, CActivityStats, CGpuStats, CPmKernelStats, *_OTHERS)
DECODER: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(list[Union[_UNION]])  # type: ignore[valid-type]  # noqa: UP007

_gpu = operator.attrgetter("gpu")
_start = operator.attrgetter("start")
_end = operator.attrgetter("end")
_name = operator.attrgetter("name")
_bytes = operator.attrgetter("bytes")
_device = operator.attrgetter("device_id")
_carried = operator.attrgetter("demangled_name")


@dataclass
class GpuWork:
    """One batch's GPU work, times in Unix ns. ``first`` orders batches when streams are merged."""

    resource: ev.Resource
    first: int
    kernel_start: np.ndarray
    kernel_end: np.ndarray
    kernel_names: list[str]
    copy_start: np.ndarray
    copy_end: np.ndarray
    copy_bytes: np.ndarray
    memset_start: np.ndarray
    memset_end: np.ndarray
    carried: list[Any]  # kernels that carry ``demangled_name`` (recorded with ``demangle: true``)
    stats: StatsWork | None = None  # the batch's statistics events (``compare_stats``)
    hardware: list[Any] = field(default_factory=list)  # its PmKernelStats (``compare_hardware``)

    @property
    def empty(self) -> bool:
        """No raw GPU record (the batch may still hold statistics)."""
        return not (len(self.kernel_start) or len(self.copy_start) or len(self.memset_start))


_EMPTY = np.empty(0, np.int64)


def gpu_work(part: Part, selection: Selection, first: int) -> GpuWork | None:
    """The GPU work of ``part`` that ``selection`` keeps; ``None`` when it rejects the process.

    ``first`` is used as the batch's order key when it has no GPU work (the stream's previous key).
    """
    if not selection.accepts(part.resource):
        return None
    events = part.events
    off = part.offset_ns
    n = len(events)
    try:
        kinds = np.fromiter(map(_gpu, events), np.int8, n)
    except AttributeError:  # full Structs (Kafka, JSON Lines)
        kinds = np.fromiter((_GPU_OF_TAG.get(tag_of(e), NONE) for e in events), np.int8, n)
    low = high = None
    if selection.timed:
        low, high = selection.window(off, events)
    columns: list[tuple[np.ndarray, np.ndarray, Sequence[Any]]] = []
    for kind in (KERNEL, MEMCPY, MEMSET, GRAPH):
        items = take(events, np.flatnonzero(kinds == kind))
        m = len(items)
        if not m:
            columns.append((_EMPTY, _EMPTY, ()))
            continue
        keep = None
        if selection.devices is not None:
            devices = np.fromiter(selection.devices, np.int64, len(selection.devices))
            keep = np.isin(np.fromiter(map(_device, items), np.int64, m), devices)
        starts = np.fromiter(map(_start, items), np.int64, m)
        if low is not None:
            inside = within(starts, low - off, high - off)  # type: ignore[operator]
            keep = inside if keep is None else keep & inside
        ends = np.fromiter(map(_end, items), np.int64, m)
        if keep is not None and not keep.all():
            items = list(itertools.compress(items, keep.tolist()))
            starts, ends = starts[keep], ends[keep]
        if high is not None:
            ends = np.minimum(ends, high - off)
        columns.append((starts + off, ends + off, items))
    (ks, ke, kernels), (cs, ce, copies), (ms, me, _), (gs, ge, graphs) = columns
    names = list(map(_name, kernels))
    if len(gs):  # graph launches count as kernels named after their graph
        ks, ke = np.concatenate([ks, gs]), np.concatenate([ke, ge])
        names += [f"CUDA graph {g.graph_id}" for g in graphs]
    starts_all = [a.min() for a in (ks, cs, ms) if len(a)]
    stats = stats_work(take(events, np.flatnonzero(kinds == STATS)), off, selection)
    if stats is not None:  # ordered by its earliest interval start, as raw work by its earliest start
        starts_all.append(stats.first)
    return GpuWork(
        resource=part.resource,
        first=int(min(starts_all)) if starts_all else first,
        kernel_start=ks,
        kernel_end=ke,
        kernel_names=names,
        copy_start=cs,
        copy_end=ce,
        copy_bytes=np.fromiter(map(_bytes, copies), np.int64, len(copies)),
        memset_start=ms,
        memset_end=me,
        carried=[k for k in kernels if getattr(k, "demangled_name", None)] if _any_carried(kernels) else [],
        stats=stats,
        hardware=hardware_rows(take(events, np.flatnonzero(kinds == HARDWARE)), off, selection),
    )


def _any_carried(kernels: Sequence[Any]) -> bool:
    try:
        return any(map(_carried, kernels))
    except AttributeError:
        return False
