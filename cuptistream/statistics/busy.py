"""GPU busy time of one device: the union of its kernel, copy and memset intervals, in bulk.

CUPTI hands records over in buffers, and not in time order across them: kernel records can arrive a
buffer after the copies that ran later. So each buffer's segments are merged on their own (``add``)
and kept as they are; only when time has moved on (``settle``) are the parts before a time merged
across buffers and counted per interval. Every segment is sorted twice, once with its buffer and
once when it settles; memory holds the segments of the last lateness margin, and at most
``PENDING_MAX`` of them: past that the oldest time is settled early (a stream whose clock stands
still, as a replay of the same buffers does, would otherwise grow without bound, hundreds of MiB in
one decode worker within seconds).
"""

from __future__ import annotations

import numpy as np

# Unsettled segments one device may hold: 16 MiB of them. A busy GPU ends ~1M kernels a second, and
# the 3 s lateness margin keeps about 3 s of segments (fewer where kernels run back to back).
PENDING_MAX = 1 << 20


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
        self.pending_segments = 0
        self.settled_until = 0  # everything before it is in ``per_interval``
        self.per_interval: dict[int, int] = {}

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Segments of one buffer. Parts before ``settled_until`` are dropped: that time was counted
        (a record that late, more than the lateness margin, is not in the busy time)."""
        starts = np.maximum(starts, self.settled_until)
        keep = ends > starts
        if keep.any():
            merged = merge(starts[keep], ends[keep])
            self.pending.append(merged)
            self.pending_segments += len(merged[0])
        while self.pending_segments > PENDING_MAX:
            # Settle up to the median end of what is held: at least half of it goes, whatever the
            # clock says (a later record before that point is left out of the busy time).
            ends_held = np.concatenate([e for _, e in self.pending])
            self.settle(int(np.partition(ends_held, len(ends_held) // 2)[len(ends_held) // 2]))

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
        self.pending_segments = sum(len(s) for s, _ in kept)
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
