"""The running aggregates ``cuptistream summary`` folds batches into, in memory bounded by the
number of distinct keys: per-key duration statistics (``Groups``, ``fold``), a union of intervals
(``IntervalUnion``), and the numpy helpers that pick a batch's events by column.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np


class IntervalUnion:
    """The total length of a union of intervals that arrive in batches, in bounded memory.

    The merged intervals are kept sorted; past ``keep`` of them, the oldest half is closed (its
    length banked) and later intervals are clipped to start after it. Exact as long as no interval
    arrives after more than ``keep // 2`` newer disjoint ones, which holds for CUPTI's buffers.
    """

    def __init__(self, keep: int = 8192) -> None:
        self.keep = keep
        self.starts = np.empty(0, np.int64)
        self.ends = np.empty(0, np.int64)
        self.closed_ns = 0
        self.floor: int | None = None

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if self.floor is not None:
            starts = np.maximum(starts, self.floor)
        live = ends > starts
        s = np.concatenate([self.starts, starts[live]])
        e = np.concatenate([self.ends, ends[live]])
        if not len(s):
            return
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        reach = np.maximum.accumulate(e)
        first = np.ones(len(s), bool)
        first[1:] = s[1:] > reach[:-1]
        index = np.flatnonzero(first)
        s, e = s[index], np.maximum.reduceat(e, index)
        if len(s) > self.keep:
            cut = len(s) - self.keep // 2
            self.closed_ns += int((e[:cut] - s[:cut]).sum())
            self.floor = int(e[cut - 1])
            s, e = s[cut:], e[cut:]
        self.starts, self.ends = s, e

    @property
    def total_ns(self) -> int:
        return self.closed_ns + int((self.ends - self.starts).sum())


I64 = (-(2**63), 2**63 - 1)  # the bounds of a numpy int64 column


def within(starts: np.ndarray, low: int, high: int) -> np.ndarray:
    """``low <= starts < high`` for Python-int bounds that may lie outside int64."""
    last = high - 1
    if low > I64[1] or last < I64[0] or last < low:
        return np.zeros(len(starts), bool)
    return (starts >= max(low, I64[0])) & (starts <= min(last, I64[1]))


def take(events: Sequence[Any], index: np.ndarray) -> Sequence[Any]:
    """``events`` at ``index`` (sorted positions), with C-level loops only."""
    if len(index) == len(events):
        return events
    if len(index) == 1:
        return [events[int(index[0])]]
    return operator.itemgetter(*index.tolist())(events) if len(index) else ()


class KeyIndex(dict[Any, int]):
    """key -> a small integer, given to each new key in the order keys are first seen."""

    def __init__(self) -> None:
        super().__init__()
        self.keys_: list[Any] = []

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self.keys_)
        self.keys_.append(key)
        return code

    def codes(self, keys: Any, n: int) -> np.ndarray:
        return np.fromiter(map(self.__getitem__, keys), np.intp, n)


class Groups:
    """count, total, min and max of durations per key, folded a batch at a time with numpy.

    Keys are coded by ``index`` (its own, or one shared with other tables: only keys that were
    folded here have rows)."""

    def __init__(self, index: KeyIndex | None = None) -> None:
        self.index = KeyIndex() if index is None else index
        self.stats = np.zeros((4, 0), np.int64)  # rows: count, total, min, max

    def add(self, keys: Sequence[str], durations: np.ndarray) -> None:
        self.add_codes(self.index.codes(keys, len(keys)), durations)

    def add_codes(self, codes: np.ndarray, durations: np.ndarray) -> None:
        width = self.stats.shape[1]
        if len(self.index.keys_) > width:
            grown = np.zeros((4, max(64, 2 * len(self.index.keys_))), np.int64)
            grown[:, :width] = self.stats
            grown[2, width:] = np.iinfo(np.int64).max
            grown[3, width:] = np.iinfo(np.int64).min
            self.stats = grown
        np.add.at(self.stats[0], codes, 1)
        np.add.at(self.stats[1], codes, durations)
        np.minimum.at(self.stats[2], codes, durations)
        np.maximum.at(self.stats[3], codes, durations)

    def items(self) -> list[tuple[Any, list[int]]]:
        keys = self.index.keys_[: self.stats.shape[1]]
        columns = self.stats[:, : len(keys)].T.tolist()
        return [(key, columns[i]) for i, key in enumerate(keys) if columns[i][0]]


def fold(stats: dict[Any, list[int]], key: Any, d: int) -> None:
    """``Groups``' count, total, min and max for one ``d``, in a plain dict: for keys folded one by one."""
    s = stats.get(key)
    if s is None:
        stats[key] = [1, d, d, d]
    else:
        s[0] += 1
        s[1] += d
        if d < s[2]:
            s[2] = d
        elif d > s[3]:
            s[3] = d
