"""GPU busy time of one device: the union of its kernel, copy and memset intervals, in bulk.

Records arrive in buffers, roughly in completion order, so a record can overlap one from an earlier
buffer by at most the longer one's duration. The union is kept as sorted disjoint segments only
near the newest time (``settle`` moves what lies before a time into per-interval totals), which
bounds memory by the records of the longest operation's duration, not of the interval.
"""

from __future__ import annotations

import numpy as np


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of ``[start, end)`` segments as sorted disjoint ones (vectorised)."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")  # timsort: linear on the few sorted runs we hand it
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
        self.starts = np.zeros(0, np.int64)
        self.ends = np.zeros(0, np.int64)
        self.settled_until = 0  # everything before it is in ``per_interval``
        self.per_interval: dict[int, int] = {}

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Segments of one buffer. Parts before ``settled_until`` are dropped: that time is counted
        already (a record that late overlapping nothing settled is undercounted, see the module)."""
        starts = np.maximum(starts, self.settled_until)
        keep = ends > starts
        self.starts, self.ends = merge(
            np.concatenate([self.starts, starts[keep]]), np.concatenate([self.ends, ends[keep]])
        )

    def settle(self, before: int) -> None:
        """Count the union before ``before`` into its intervals and forget it."""
        if before <= self.settled_until:
            return
        self.settled_until = before
        s, e = self.starts, self.ends
        cut = int(np.searchsorted(s, before))  # segments starting before ``before``
        if not cut:
            return
        ps, pe = s[:cut], np.minimum(e[:cut], before)
        step = self.interval_ns
        first, last = ps // step, (pe - 1) // step
        same = first == last
        if same.any():
            base = int(first[same].min())
            sums = np.bincount(first[same] - base, weights=(pe - ps)[same])
            for offset in np.flatnonzero(sums).tolist():
                self._add(base + offset, round(float(sums[offset])))
        for a, b in zip(ps[~same].tolist(), pe[~same].tolist(), strict=True):  # across a boundary: rare
            while a < b:
                edge = min((a // step + 1) * step, b)
                self._add(a // step, edge - a)
                a = edge
        rest = e[:cut] > before  # the last segment may run on past ``before``
        self.starts = np.concatenate([np.maximum(s[:cut][rest], before), s[cut:]])
        self.ends = np.concatenate([e[:cut][rest], e[cut:]])

    def _add(self, interval: int, ns: int) -> None:
        self.per_interval[interval] = self.per_interval.get(interval, 0) + ns

    def take(self, interval: int) -> int:
        return self.per_interval.pop(interval, 0)
