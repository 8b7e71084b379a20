"""How fast a stream issued CUDA calls inside its trace windows and between them, from the
correlation ids of the records the windows hold.

A budget window sees the program while CUPTI records its work, and a launch-bound program launches
more slowly then (W2 on the H100: 29k kernels/s inside its windows, 31k between them), so counts
scaled by time alone come out low. CUPTI numbers every runtime and driver API call of the process
with the next correlation id whether or not anything is traced (measured on the H100: W1's ids
advanced by 376k in the 4.9 s between two windows, one per launch, as inside them), so the ids
of a window's first records against the previous window's last ones count the calls made between
the two. ``correction`` is the rate between windows over the rate inside them.

Failure modes: with fewer than two windows, or ids that do not increase (another process's ids
cannot mix in: one stream is one process), the correction is 1 (time scaling alone). A program
that changes phase between two windows gets the mean rate of the two phases for that gap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Records further apart than this belong to different windows (budget windows are >= 20 ms and
# their pauses seconds; within a window the records of one buffer are microseconds apart).
_SAME_WINDOW_NS = 500_000_000
_KEPT = 64  # windows remembered: intervals close a few seconds late, windows come every few seconds
_LEAST_IDS = 32  # a window with fewer calls in it gives no rate worth dividing by


@dataclass
class _Window:
    t_first: int  # ns: the earliest record start seen in it, and that record's id
    id_first: int
    t_last: int
    id_last: int


class LaunchRate:
    """The windows of one stream, as (time, correlation id) at their first and last records."""

    def __init__(self) -> None:
        self._windows: list[_Window] = []

    def add(self, start: np.ndarray, correlation: np.ndarray) -> None:
        """One buffer's records: start times (ns) and correlation ids (0 for records without one)."""
        has_id = correlation > 0
        if not has_id.any():
            return
        start, correlation = start[has_id], correlation[has_id]
        first, last = int(correlation.argmin()), int(correlation.argmax())
        t_first, t_last = int(start[first]), int(start[last])
        id_first, id_last = int(correlation[first]), int(correlation[last])
        current = self._windows[-1] if self._windows else None
        if current is not None and abs(t_first - current.t_last) < _SAME_WINDOW_NS:
            if id_first < current.id_first:
                current.t_first, current.id_first = t_first, id_first
            if id_last > current.id_last:
                current.t_last, current.id_last = t_last, id_last
            return
        self._windows.append(_Window(t_first, id_first, t_last, id_last))
        del self._windows[:-_KEPT]

    def correction(self, low: int, high: int) -> float:
        """Calls per second between windows over calls per second inside them, for the windows that
        began in ``[low, high)`` (each with the gap before it); 1.0 when that cannot be measured."""
        inside_ids = inside_ns = between_ids = between_ns = 0
        for before, window in zip(self._windows, self._windows[1:], strict=False):
            if not low <= window.t_first < high:
                continue
            gap_ids, gap_ns = window.id_first - before.id_last, window.t_first - before.t_last
            ids, ns = window.id_last - window.id_first, window.t_last - window.t_first
            if gap_ids <= 0 or gap_ns <= 0 or ids < _LEAST_IDS or ns <= 0:
                continue
            inside_ids, inside_ns = inside_ids + ids, inside_ns + ns
            between_ids, between_ns = between_ids + gap_ids, between_ns + gap_ns
        if not inside_ids or not between_ns:
            return 1.0
        return (between_ids / between_ns) / (inside_ids / inside_ns)
