"""The summary's table of kernels' hardware utilization: per host, device and kernel name, the PM
sampling counters attributed to the name's kernels (the collector's ``PmKernelStats``, made by
``statistics.pm_attribution``), aggregated over the intervals in the recording or the window.

Per metric the mean is the intervals' means weighted by their covered kernel time (``covered_ns``):
the overlap-weighted mean over every sample the name's kernels ran in, whatever interval it fell in.
Intervals without a value for a metric are left out of that metric's mean. ``covered_share`` is the
summed covered time over the summed kernel time; ``own_share`` is weighted as the means. Rows are
the top names by kernel time on each device (``--top``), so every GPU shows its own top kernels.
The warehouse query ``kernel_utilization.sql`` computes the same figures from the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cuptistream.cupti.pm_metrics import field_of

NAME = "kernel_hw_utilization"
TITLE = "Kernels' hardware utilization (PM sampling attributed to kernels; means weighted by covered time)"
KEY_FIELDS = ("sm_active", "tensor_active", "dram_active", "sm_occupancy")  # the text table's columns
COLUMNS = [
    "host", "device", "name", "kernel_ns", "covered_share", *(f + "_pct" for f in KEY_FIELDS),
    "intervals", "samples", "covered_ns", "own_share", "means",
]  # fmt: skip
HIDDEN = frozenset({"intervals", "samples", "covered_ns", "own_share", "means"})  # JSON and CSV only


@dataclass
class NameTotals:
    """One kernel name's counters summed over intervals (weighted by covered time)."""

    intervals: int = 0
    samples: int = 0
    kernel_ns: int = 0
    covered_ns: int = 0
    own: float = 0.0  # sum of own_share * covered_ns
    weighted: dict[str, float] = field(default_factory=dict)  # metric -> sum of mean * covered_ns
    weights: dict[str, int] = field(default_factory=dict)  # metric -> covered_ns of intervals with a value

    def add(self, st: Any) -> None:
        self.intervals += 1
        self.samples += st.samples
        self.kernel_ns += st.kernel_ns
        self.covered_ns += st.covered_ns
        self.own += st.own_share * st.covered_ns
        for metric, mean in zip(st.metrics, st.mean, strict=True):
            self.weighted.setdefault(metric, 0.0)
            self.weights.setdefault(metric, 0)
            if mean is not None and not math.isnan(mean):  # CUPTI gave no value in the interval
                self.weighted[metric] += mean * st.covered_ns
                self.weights[metric] += st.covered_ns

    def merge(self, other: NameTotals) -> None:
        self.intervals += other.intervals
        self.samples += other.samples
        self.kernel_ns += other.kernel_ns
        self.covered_ns += other.covered_ns
        self.own += other.own
        for metric, value in other.weighted.items():
            self.weighted[metric] = self.weighted.get(metric, 0.0) + value
            self.weights[metric] = self.weights.get(metric, 0) + other.weights[metric]

    def means(self) -> dict[str, float | None]:
        return {m: self.weighted[m] / w if (w := self.weights[m]) else None for m in self.weighted}


class KernelHardwareTotals:
    """Folds ``PmKernelStats`` (light or full Structs) into the table's rows."""

    def __init__(self) -> None:
        self.names: dict[tuple[str, int, str], NameTotals] = {}  # (host, device, name as recorded)

    def __bool__(self) -> bool:
        return bool(self.names)

    def add(self, host: str, st: Any) -> None:
        key = (host, st.device_id, st.name)
        row = self.names.get(key)
        if row is None:
            row = self.names[key] = NameTotals()
        row.add(st)

    def rows(self, display: Callable[[str], str], top: int | None) -> tuple[list[list[Any]], int]:
        """(rows, rows before ``top`` cut each device's list); names as ``display`` shows them (two
        recorded names that demangle alike are one row)."""
        shown: dict[tuple[str, int], dict[str, NameTotals]] = {}
        for (host, device, name), totals in self.names.items():
            names = shown.setdefault((host, device), {})
            mine = names.setdefault(display(name), NameTotals())
            mine.merge(totals)
        rows: list[list[Any]] = []
        total = 0
        for (host, device), names in sorted(shown.items()):
            ranked = sorted(names.items(), key=lambda kv: (-kv[1].kernel_ns, kv[0]))
            total += len(ranked)
            for name, n in ranked[:top] if top is not None else ranked:
                means = n.means()
                by_field = {field_of(m): v for m, v in means.items()}
                rows.append([
                    host, device, name, n.kernel_ns, n.covered_ns / n.kernel_ns if n.kernel_ns else 0.0,
                    *(by_field.get(f) for f in KEY_FIELDS),
                    n.intervals, n.samples, n.covered_ns,
                    n.own / n.covered_ns if n.covered_ns else 0.0, means,
                ])  # fmt: skip
        return rows, total
