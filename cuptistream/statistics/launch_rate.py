"""How fast a stream issued CUDA calls inside its trace windows and over the whole run, from the
windows' spans and the correlation ids of the records they hold.

A budget window sees the program while CUPTI records its work, and a launch-bound program launches
more slowly then (a few percent fewer kernels a second inside its windows than between them), so
counts scaled by time alone come out low. CUPTI numbers every runtime and driver API call of the
process with the next correlation id whether or not anything is traced (between two windows the ids
advance by one per launch, as inside them). So:

- **inside** the windows, the program made (last id - first id + 1) calls in each window's open
  time (its ``TraceSpan``, not its records' span: a program that works in bursts and waits between
  them has records over part of a window only, and their span overstates the rate; programs held to
  a fixed rate read several percent too few kernels that way);
- **overall**, from one window's first id to the next's, over the time between their openings: a
  whole cycle of window and gap, so a burst's position in either window cancels.

``correction`` is the overall rate over the rate inside: the calls of the whole observed time per
call traced, over the time scale alone.

CUPTI numbers calls only while it is attached: a window after a detached gap (``TraceSpan.fresh``,
``activity.between_windows: detach``) starts no cycle from the window before it. With every gap
detached, counts are scaled by time alone, which reads a launch-bound program low by the slowdown
tracing causes inside its windows (a paced or GPU-bound program is read right).

Failure modes: with fewer than two windows holding records, fewer than ``_LEAST_IDS`` calls inside,
or ids that do not increase (another process's ids cannot mix in: one stream is one process), the
correction is 1 (time scaling alone). A program that changes phase between two windows gets the mean
rate of the cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

_KEPT = 64  # windows remembered: intervals close a few seconds late, windows come every few seconds
_LEAST_IDS = 32  # fewer calls inside the windows give no rate worth dividing by
# A window's kernels run after their launches: those queued at its close start up to this much later.
# Records that start later than this after the window closed are not its (``continuous`` kinds).
_QUEUED_NS = 1_000_000_000


@dataclass
class _Window:
    start: int  # ns: the span's opening and closing (0 while open)
    end: int = 0
    id_first: int = 0  # the smallest and largest correlation id of its records (0: none yet)
    id_last: int = 0
    fresh: bool = False  # CUPTI attached anew for it: no cycle from the window before


class LaunchRate:
    """The trace windows of one stream: their spans, and the correlation ids recorded in each."""

    def __init__(self) -> None:
        self._windows: dict[int, _Window] = {}  # by window number, in the order they opened

    def span(self, window: int, start: int, end: int, fresh: bool = False) -> None:
        """A window that traces GPU work opened (``end`` 0) or closed; ``fresh``: CUPTI attached anew
        for it (detached since the last window)."""
        known = self._windows.get(window)
        if known is None:
            self._windows[window] = _Window(start, end, fresh=fresh)
            for old in list(self._windows)[:-_KEPT]:
                del self._windows[old]
        elif end:
            known.end = end

    def add(self, start: np.ndarray, correlation: np.ndarray) -> None:
        """One buffer's records: start times (ns) and correlation ids (0 for records without one).
        They belong to the latest window that opened before the earliest of them (a window's
        records are flushed before the next one opens), unless it had closed well before."""
        has_id = correlation > 0
        if not has_id.any():
            return
        t_first = int(start[has_id].min())
        owner = None
        for window in self._windows.values():
            if window.start <= t_first and (owner is None or window.start > owner.start):
                owner = window
        if owner is None or (owner.end and t_first > owner.end + _QUEUED_NS):
            return
        ids = correlation[has_id]
        low, high = int(ids.min()), int(ids.max())
        owner.id_first = low if not owner.id_first else min(owner.id_first, low)
        owner.id_last = max(owner.id_last, high)

    def correction(self, low: int, high: int) -> float:
        """Calls per second over the cycles of the windows that opened in ``[low, high)``, over
        calls per second inside those windows; 1.0 when that cannot be measured."""
        closed = sorted((w for w in self._windows.values() if w.end > w.start), key=lambda w: w.start)
        inside_ids = inside_ns = cycle_ids = cycle_ns = 0
        for window in closed:
            if low <= window.start < high:
                inside_ns += window.end - window.start
                if window.id_first:
                    inside_ids += window.id_last - window.id_first + 1
        held = [w for w in closed if w.id_first]
        for before, window in pairwise(held):
            if low <= window.start < high and not window.fresh and window.id_first > before.id_first:
                cycle_ids += window.id_first - before.id_first
                cycle_ns += window.start - before.start
        if inside_ids < _LEAST_IDS or not inside_ns or not cycle_ns:
            return 1.0
        return (cycle_ids / cycle_ns) / (inside_ids / inside_ns)
