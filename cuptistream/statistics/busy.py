"""GPU busy time of one device: the union of its kernel, copy and memset intervals, in bulk.

CUPTI hands records over in buffers, and not in time order across them: kernel records can arrive a
buffer after the copies that ran later. So each buffer's segments are merged on their own (``add``)
and kept as they are; only when time has moved on (``settle``) are the parts before a time merged
across buffers and counted per interval. Every segment is sorted twice, once with its buffer and
once when it settles; memory holds the segments of the last lateness margin.
"""

from __future__ import annotations

import numpy as np


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of ``[start, end)`` segments as sorted disjoint ones (vectorised)."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")  # timsort: near-linear on the sorted runs we hand it
    s, e = starts[order], np.maximum.accumulate(ends[order])
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], e[last]


class DeviceBusy:
    """The busy union of one device, settled into ``per_interval`` (interval index -> ns)."""

    def __init__(self, interval_ns: int) -> None:
        self.interval_ns = interval_ns
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # per buffer: sorted, disjoint
        self.settled_until = 0  # everything before it is in ``per_interval``
        self.per_interval: dict[int, int] = {}

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Segments of one buffer. Parts before ``settled_until`` are dropped: that time was counted
        (a record that late, more than the lateness margin, is not in the busy time)."""
        starts = np.maximum(starts, self.settled_until)
        keep = ends > starts
        if keep.any():
            self.pending.append(merge(starts[keep], ends[keep]))

    def settle(self, before: int) -> None:
        """Count the union before ``before`` into its intervals and forget it."""
        if before <= self.settled_until or not self.pending:
            self.settled_until = max(self.settled_until, before)
            return
        self.settled_until = before
        done_s: list[np.ndarray] = []
        done_e: list[np.ndarray] = []
        kept: list[tuple[np.ndarray, np.ndarray]] = []
        for s, e in self.pending:
            cut = int(np.searchsorted(s, before))  # segments starting before ``before``
            if cut:
                done_s.append(s[:cut])
                done_e.append(np.minimum(e[:cut], before))
                if e[cut - 1] > before:  # the last one runs on past it
                    s, e = np.concatenate([[before], s[cut:]]), np.concatenate([e[cut - 1 : cut], e[cut:]])
                else:
                    s, e = s[cut:], e[cut:]
            if len(s):
                kept.append((s, e))
        self.pending = kept
        if done_s:
            self._count(*merge(np.concatenate(done_s), np.concatenate(done_e)))

    def _count(self, starts: np.ndarray, ends: np.ndarray) -> None:
        step = self.interval_ns
        first, last = starts // step, (ends - 1) // step
        same = first == last
        if same.any():
            base = int(first[same].min())
            sums = np.bincount(first[same] - base, weights=(ends - starts)[same])
            for offset in np.flatnonzero(sums).tolist():
                self._add(base + offset, round(float(sums[offset])))
        for a, b in zip(starts[~same].tolist(), ends[~same].tolist(), strict=True):  # across a boundary
            while a < b:
                edge = min((a // step + 1) * step, b)
                self._add(a // step, edge - a)
                a = edge

    def _add(self, interval: int, ns: int) -> None:
        self.per_interval[interval] = self.per_interval.get(interval, 0) + ns

    def take(self, interval: int) -> int:
        return self.per_interval.pop(interval, 0)
