"""Recordings of a job's ranks as the always-on mode writes them: the collector's statistics only.

Each rank of ``tests.helpers.ranks.rank_processes`` (the replayed real-GPU capture, one kernel
possibly scaled on one rank) has its kernel, memcpy and memset records folded by the collector's own
statistics code (``cuptistream.statistics.Accumulator``), as the collector folds CUPTI's buffers
under ``activity.records: on_demand``; the raw records are then dropped, so the recording holds
``ActivityStats`` and ``GpuStats`` and the other events (API calls, ...), as an always-on recording
does.

``traced`` makes it a budget-mode recording: a presence span over the whole capture (the process is
there) and one trace window over the first ``traced`` part of it; only the records that start in the
window are folded, as CUPTI delivers only those, so the statistics carry ``estimated_*`` values.
"""

from __future__ import annotations

import numpy as np

from cuptistream import events as ev
from cuptistream.cupti.activity_enums import COPY_KINDS, MEMORY_KINDS
from cuptistream.statistics import Accumulator
from tests.helpers.fixture_recording import Process

_KINDS = ["concurrent_kernel", "memcpy", "memset"]  # the activity kinds a trace window enables
_DTYPE = [("start", np.uint64), ("end", np.uint64), ("device_id", np.uint32), ("name", np.uint64),
          ("copy_kind", np.uint8), ("memory_kind", np.uint8), ("bytes", np.uint64)]  # fmt: skip


def _records(items: list[ev.Event], names: list[str]) -> np.ndarray:
    """Activity records (the decoder's structured arrays, the fields the statistics read)."""
    out = np.zeros(len(items), _DTYPE)
    for i, e in enumerate(items):
        out[i]["start"], out[i]["end"], out[i]["device_id"] = e.start, e.end, e.device_id  # type: ignore[attr-defined]
        if isinstance(e, ev.Kernel):
            if e.name not in names:
                names.append(e.name)
            out[i]["name"] = names.index(e.name) + 1  # a name "pointer": never 0
        elif isinstance(e, ev.Memcpy):
            out[i]["copy_kind"], out[i]["bytes"] = COPY_KINDS.index(e.copy_kind), e.bytes
        elif isinstance(e, ev.Memset):
            out[i]["memory_kind"], out[i]["bytes"] = MEMORY_KINDS.index(e.memory_kind), e.bytes
    return out


def statistics_only(
    process: Process, interval_ns: int, traced: float | None = None, keep_raw: bool = False
) -> Process:
    """``process`` as the always-on mode records it: statistics of its GPU records, no raw ones
    (with ``keep_raw``, as ``full`` mode with statistics on records it: both)."""
    gpu = [e for e in process.events if isinstance(e, (ev.Kernel, ev.Memcpy, ev.Memset))]
    lo, hi = min(e.start for e in gpu), max(e.end for e in gpu)
    names: list[str] = []
    acc = Accumulator(interval_ns, max_names=64, names=lambda pointer: names[pointer - 1])
    out: list[ev.Event] = []
    if traced is not None:
        until = lo + round((hi - lo) * traced)
        out += acc.span(0, lo, hi, [])  # presence: the process is there from lo to hi
        out += acc.span(1, lo, 0, _KINDS)
        out += acc.span(1, lo, until, _KINDS)
        gpu = [e for e in gpu if e.start < until]  # type: ignore[attr-defined]
    for category, kind in (("kernel", ev.Kernel), ("memcpy", ev.Memcpy), ("memset", ev.Memset)):
        acc.add(category, _records([e for e in gpu if isinstance(e, kind)], names))
    out += acc.buffer_done()
    out += acc.close()
    raw = (ev.Kernel, ev.Memcpy, ev.Memset, ev.GraphLaunch)
    kept = [e for e in process.events if keep_raw or not isinstance(e, raw)]
    return Process(process.resource, process.clock, kept + out)
