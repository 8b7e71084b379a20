"""How much of an interval one decode stream traced, per category (kernel, memcpy, memset).

Until the probe sends ``TraceSpan`` messages, a stream counts as traced continuously from its first
record to its newest (``activity.mode: full``). From the first span on, coverage is the union of
the spans whose kinds include the category (a span naming no kinds covers every category); an open
span covers up to the newest time seen. What was traced continuously before the first span stays
covered, as a span of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cuptistream.cupti.kinds import KINDS

CATEGORIES = ("kernel", "memcpy", "memset")


def categories_of(kinds: list[str]) -> frozenset[str]:
    """The statistics categories that activity kind names (``concurrent_kernel``, ...) trace. An
    empty list traces nothing: budget mode's presence span (the process is there, between windows)."""
    return frozenset(KINDS[k].event for k in kinds if k in KINDS and KINDS[k].event in CATEGORIES)


@dataclass
class _Span:
    start: int
    end: int  # 0: open
    categories: frozenset[str]


class Coverage:
    """The traced time of one stream. Fed with record times (``saw``) and spans (``span``)."""

    def __init__(self) -> None:
        self.first: int | None = None  # earliest record start
        self.began: int | None = None  # earliest time seen: record starts and span starts
        self.newest = 0  # newest time seen: record ends and span messages
        self.spans: dict[int, _Span] | None = None  # None until the first TraceSpan

    def saw(self, first: int, last: int) -> None:
        if self.first is None or first < self.first:
            self.first = first
        if self.began is None or first < self.began:
            self.began = first
        self.newest = max(self.newest, last)

    def span(self, window: int, start: int, end: int, kinds: list[str]) -> None:
        """A window opened (``end`` 0) or closed."""
        if self.spans is None:
            self.spans = {}
            if self.first is not None:  # the continuous tracing so far
                self.spans[-1] = _Span(self.first, max(self.newest, self.first), frozenset(CATEGORIES))
        self.newest = max(self.newest, start, end)
        if self.began is None or start < self.began:
            self.began = start
        known = self.spans.get(window)
        if known is not None and end:
            known.end = end
        else:
            self.spans[window] = _Span(start, end, categories_of(kinds))

    def closed_ends(self, category: str, starts: np.ndarray) -> np.ndarray | None:
        """For each of ``starts``, the end of the closed span tracing ``category`` that holds it, 0
        where none does; None before the first span (continuous tracing)."""
        if self.spans is None:
            return None
        closed = sorted((s.start, s.end) for s in self.spans.values() if s.end and category in s.categories)
        if not closed:
            return None
        begins = np.array([b for b, _ in closed], dtype=np.int64)
        ends = np.array([e for _, e in closed], dtype=np.int64)
        index = np.searchsorted(begins, starts, side="right") - 1
        found = np.where(index >= 0, ends[np.maximum(index, 0)], 0)
        return np.where((index >= 0) & (starts < found), found, 0)

    def open_spans(self) -> bool:
        return self.spans is not None and any(not s.end for s in self.spans.values())

    def observed(self, low: int, high: int) -> int:
        """ns of ``[low, high)`` the stream was there for: from the first time it showed (a record
        or a span) to the newest. Estimates scale to this, not to time before the program started
        or after it ended."""
        if self.began is None:
            return 0
        return max(0, min(high, self.newest) - max(low, self.began))

    def traced(self, category: str, low: int, high: int) -> int:
        """ns of ``[low, high)`` traced for ``category``."""
        if self.spans is None:
            if self.first is None:
                return 0
            segments = [(self.first, self.newest)]
        else:
            segments = sorted(
                (s.start, s.end or max(self.newest, s.start))
                for s in self.spans.values()
                if category in s.categories
            )
        total, reach = 0, low
        for start, end in segments:  # sorted by start: count each ns once
            start, end = max(start, reach), min(end, high)
            if end > start:
                total += end - start
                reach = end
        return total

    def forget_before(self, time: int) -> None:
        """Drop closed spans that ended before ``time`` (intervals before it are closed)."""
        if self.spans is not None:
            for window in [w for w, s in self.spans.items() if s.end and s.end < time]:
                del self.spans[window]
