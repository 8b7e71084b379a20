"""One rank's GPU work in one interval, or over the whole span: the unit ``compare`` folds into and
compares (``compare.Comparer``). The same ``Tally`` takes raw records (``add_kernels``,
``add_copies``, busy as an ``IntervalUnion``) or the collector's statistics rows
(``add_stat_kernels``, busy as a sum), and says which in ``basis``.
"""

from __future__ import annotations

import numpy as np

from cuptistream.analysis.aggregate import IntervalUnion
from cuptistream.analysis.compare_stats import Seen


def _grow(array: np.ndarray, n: int) -> np.ndarray:
    if len(array) >= n:
        return array
    grown = np.zeros(max(n, 2 * len(array), 64), array.dtype)
    grown[: len(array)] = array
    return grown


class Tally:
    """One rank's GPU work in one interval (or over the whole span)."""

    def __init__(self, busy: bool, statistics: bool = False) -> None:
        self.compute_ns = 0
        self.nccl_ns = 0
        self.copy_ns = 0
        self.copy_bytes = 0
        self.kernels = 0
        self.kernel_ns = np.zeros(0, np.int64)  # by kernel code (``Comparer.names``)
        self.kernel_count = np.zeros(0, np.int64)
        self.busy = IntervalUnion() if busy else None
        self.busy_ns = 0  # whole span: the sum of the closed intervals' busy time
        self.lo: int | None = None  # the span of the rank's GPU work (the interval's, or the whole)
        self.hi: int | None = None
        self.statistics = statistics  # from statistics events, not raw records
        self.estimated = False  # any statistics row in it was scaled from part of its interval
        # statistics: kernel time measured, and estimated for the whole time; their ratio is the share
        # of the time traced (weighted by kernel time), exact for a process there the whole interval
        self.measured_ns = 0
        self.estimated_ns = 0
        self.seen = Seen() if statistics else None  # whole span: the intervals with statistics
        self.gaps: tuple[int, int] | None = None  # whole span: (intervals with statistics, of the span)

    def basis(self) -> str:
        """Where the numbers come from: ``records``, or statistics (measured, or estimated)."""
        if not self.statistics:
            return "records"
        if not self.estimated:
            return "statistics (measured)"
        share = 100 * self.measured_ns / self.estimated_ns if self.estimated_ns else 0.0
        gaps = f"; statistics in {self.gaps[0]} of {self.gaps[1]} intervals, gaps scaled" if self.gaps else ""
        return f"statistics (estimated, traced {share:.1f}%{gaps})"

    def scaled(self, factor: float) -> Tally:
        """A copy with every total scaled by ``factor`` (counts rounded)."""
        out = Tally(busy=False, statistics=self.statistics)
        out.__dict__.update(self.__dict__)
        for name in ("compute_ns", "nccl_ns", "copy_ns", "copy_bytes", "kernels", "busy_ns"):
            setattr(out, name, round(getattr(self, name) * factor))
        out.kernel_ns = np.rint(self.kernel_ns * factor).astype(np.int64)
        out.kernel_count = np.rint(self.kernel_count * factor).astype(np.int64)
        out.estimated = True
        return out

    def add_kernels(
        self, codes: np.ndarray, durations: np.ndarray, nccl: np.ndarray, n_names: int,
        counts: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        """Kernels by name code; ``counts``: launches per entry (statistics rows), else one each."""
        self.kernels += len(codes) if counts is None else int(counts.sum())
        total = int(durations.sum())
        in_nccl = int(durations[nccl[codes]].sum())
        self.nccl_ns += in_nccl
        self.compute_ns += total - in_nccl
        self.kernel_ns = _grow(self.kernel_ns, n_names)
        self.kernel_count = _grow(self.kernel_count, n_names)
        width = len(self.kernel_ns)
        self.kernel_ns += np.bincount(codes, weights=durations, minlength=width).astype(np.int64)
        self.kernel_count += np.bincount(codes, weights=counts, minlength=width).astype(np.int64)

    def add_stat_kernels(
        self, codes: np.ndarray, ns: np.ndarray, measured: np.ndarray, estimated: np.ndarray,
        counts: np.ndarray, nccl: np.ndarray, n_names: int,
    ) -> None:  # fmt: skip
        """Statistics rows of kernels: estimated ns and counts, and the measured ns behind them."""
        self.add_kernels(codes, ns, nccl, n_names, counts)
        self.measured_ns += int(measured.sum())
        self.estimated_ns += int(ns.sum())
        self.estimated |= bool(estimated.any())

    def add_copies(self, durations: np.ndarray, nbytes: np.ndarray) -> None:
        self.copy_ns += int(durations.sum())
        self.copy_bytes += int(nbytes.sum())

    def reach(self, lo: int, hi: int) -> None:
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)
