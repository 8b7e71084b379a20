"""What ``cuptistream compare`` reads of a batch's statistics events (``ActivityStats``, ``GpuStats``).

Recordings of the always-on mode (``activity.records: on_demand``) hold no raw kernel, copy or memset
records, only the collector's statistics: per interval, device and name, a count and a total, and,
where only part of the interval was traced, ``estimated_*`` values scaled to the whole of it. compare
takes the ``estimated_*`` values (they equal the measured ones where everything was traced), so a
rank traced 3 % of the time is compared on the same scale as a rank traced throughout.

``CActivityStats`` and ``CGpuStats`` are the summary's light Structs (``analysis.records``: the
fields the views read; msgspec skips the rest, the histogram's buckets included), tagged for
``compare_read.DECODER``. ``stats_work`` turns a batch's
statistics into ``StatsWork`` rows in Unix ns; it takes light and full Structs alike (files, Kafka).

GPU busy: ``GpuStats.busy_ns`` is the busy union within the traced time only. Where the interval
was partly traced (``estimated``) it is scaled by the factor the same interval and device's kernel
rows were scaled by (``estimated_total_ns / total_ns``: observed time over traced time), so busy and
kernel time are estimates on one scale; without kernel rows in the batch, by the interval over the
traced time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cuptistream.analysis.records import LActivityStats, LGpuStats, tag_of
from cuptistream.analysis.select import Selection
from cuptistream.errors import UserError

STATS_TAGS = ("activity_stats", "gpu_stats")
STATS = 5  # the kind ``compare_read.gpu_work`` gives statistics events (after its raw GPU kinds)


# The summary's light Structs (``analysis.records``), tagged into ``compare_read``'s union by ``gpu``.
class CActivityStats(LActivityStats, tag="activity_stats"):
    gpu: ClassVar[int] = STATS


class CGpuStats(LGpuStats, tag="gpu_stats"):
    gpu: ClassVar[int] = STATS


@dataclass
class StatsWork:
    """One batch's statistics rows, times in Unix ns (each list: one row per statistics row)."""

    # (interval start, interval end, kernel name as recorded, estimated count, estimated ns,
    #  measured ns, estimated?)
    kernels: list[tuple[int, int, str, int, int, int, bool]] = field(default_factory=list)
    # (interval start, interval end, estimated ns, estimated bytes) of memcpys
    copies: list[tuple[int, int, int, int]] = field(default_factory=list)
    # (interval start, interval end, busy ns scaled like the kernel rows, estimated?)
    gpu: list[tuple[int, int, int, bool]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.kernels or self.copies or self.gpu)

    def spans(self) -> list[tuple[int, int]]:
        """The (start, end) of every row's statistics interval."""
        return [(row[0], row[1]) for rows in (self.kernels, self.copies, self.gpu) for row in rows]

    @property
    def first(self) -> int:
        return min(start for start, _ in self.spans())


def stats_work(events: Sequence[Any], offset_ns: int, selection: Selection) -> StatsWork | None:
    """The rows of the statistics events ``events`` (light or full) that ``selection`` keeps (its
    devices and time window, by interval start); None when there are none."""
    if not events:
        return None
    out = StatsWork()
    low, high = -(2**63), 2**63
    if selection.timed:
        low, high = selection.window(offset_ns, events)
    scale: dict[tuple[int, int], list[int]] = {}  # (interval start, device) -> [measured, estimated]
    busy: list[tuple[int, int, int, Any]] = []
    for event in events:
        if selection.devices is not None and event.device_id not in selection.devices:
            continue
        start, end = event.interval_start + offset_ns, event.interval_end + offset_ns
        if not low <= start < high:
            continue
        if tag_of(event) == "gpu_stats":
            busy.append((start, end, event.device_id, event))
        elif event.category == "kernel":
            out.kernels.append((start, end, event.name, event.estimated_count, event.estimated_total_ns,
                                event.total_ns, bool(event.estimated)))  # fmt: skip
            pair = scale.setdefault((start, event.device_id), [0, 0])
            pair[0] += event.total_ns
            pair[1] += event.estimated_total_ns
        elif event.category == "memcpy":
            out.copies.append((start, end, event.estimated_total_ns, event.estimated_bytes))
        # memsets count in busy (GpuStats) only, as raw memsets do
    for start, end, device, st in busy:
        ns = st.busy_ns
        if st.estimated:
            measured, estimated = scale.get((start, device), (0, 0))
            ns = round(ns * estimated / measured) if measured else round(st.busy_fraction * (end - start))
        out.gpu.append((start, end, ns, bool(st.estimated)))
    return out if out else None


class Seen:
    """The distinct statistics intervals a rank has rows for, counted in bounded memory: the
    collector emits no statistics for an interval it traced none of (a budget-mode gap), and the
    whole span scales over such gaps (``Comparer._whole``). Rows come nearly in time order, so only
    the recent interval starts are kept to tell a new interval from another device's or batch's."""

    _KEEP = 256

    def __init__(self) -> None:
        self.count = 0
        self.length = 0  # the statistics' interval, ns
        self._recent: set[int] = set()

    def add(self, start: int, length: int) -> None:
        if start in self._recent:
            return
        self.count += 1
        self.length = length
        self._recent.add(start)
        if len(self._recent) > self._KEEP:
            floor = max(self._recent) - self._KEEP // 2 * length
            self._recent = {s for s in self._recent if s >= floor}


class StatisticsIntervalError(UserError):
    """The compare interval does not hold whole statistics intervals (shorter, or not a multiple)."""


def nest(interval_ns: int, known: int | None, length: int) -> int:
    """The statistics' interval to report, after checking that ``length`` nests in ``interval_ns``:
    a statistics interval is summed whole into one compare interval, it cannot be split. Ranks whose
    collectors use different intervals are fine while ``--interval`` is a multiple of each."""
    if length == known:
        return known
    if length <= 0 or interval_ns % length:
        seconds = length / 1e9
        raise StatisticsIntervalError(
            f"--interval {interval_ns / 1e9:g}s does not hold whole statistics intervals of "
            f"{seconds:g}s (they cannot be split): give {seconds:g}s or a multiple of it, "
            f"e.g. --interval {math.lcm(max(length, 1), interval_ns) / 1e9:g}s"
        )
    return max(length, known or 0)
