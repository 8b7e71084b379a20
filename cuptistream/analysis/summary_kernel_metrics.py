"""The summary's table of per-kernel metrics from on-demand windows (``cuptistream trace --metrics``,
``KernelMetrics`` events): per host, device, kernel name and metric, the mean over every profiled
launch in the recording (or the summary's window), each window's mean weighted by its launches.

One row per name and metric (the metrics differ from one window's set to another's). Names are
ranked per device by their profiled GPU time (the mean ``gpu__time_duration.sum`` times launches,
where the set has it; else by launches) and cut to the top ones (``--top``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

NAME = "kernel_metrics"
TITLE = "Kernel metrics of on-demand windows (range profiler; means over profiled launches)"
COLUMNS = ["host", "device", "name", "launches", "passes", "metric", "mean"]
DURATION = "gpu__time_duration.sum"


@dataclass
class _Name:
    launches: int = 0
    passes: int = 0
    weighted: dict[str, float] = field(default_factory=dict)  # metric -> sum of mean * launches
    weights: dict[str, int] = field(default_factory=dict)  # metric -> launches with a value

    def add(self, launches: int, passes: int, metrics: list[str], values: list[float | None]) -> None:
        self.launches += launches
        self.passes = max(self.passes, passes)
        for metric, value in zip(metrics, values, strict=True):
            self.weighted.setdefault(metric, 0.0)
            self.weights.setdefault(metric, 0)
            if value is not None:
                self.weighted[metric] += value * launches
                self.weights[metric] += launches

    def merge(self, other: _Name) -> None:
        """Take in ``other``'s launches (a recorded name that displays alike, demangled)."""
        self.launches += other.launches
        self.passes = max(self.passes, other.passes)
        for metric, value in other.weighted.items():
            self.weighted[metric] = self.weighted.get(metric, 0.0) + value
            self.weights[metric] = self.weights.get(metric, 0) + other.weights[metric]

    def mean(self, metric: str) -> float | None:
        weight = self.weights.get(metric, 0)
        return self.weighted[metric] / weight if weight else None

    def rank(self) -> float:
        duration = self.mean(DURATION)
        return duration * self.launches if duration is not None else float(self.launches)


class KernelMetricsTotals:
    """Folds ``KernelMetrics`` (light or full Structs) into the table's rows."""

    def __init__(self) -> None:
        self.names: dict[tuple[str, int, str], _Name] = {}  # (host, device, name as recorded)

    def add(self, host: str, event: Any) -> None:
        for k, name in enumerate(event.names):
            row = self.names.setdefault((host, event.device_id, name), _Name())
            row.add(event.launches[k], event.passes, event.metrics, [column[k] for column in event.values])

    def rows(self, display: Callable[[str], str], top: int | None) -> tuple[list[list[Any]], int]:
        """(rows, names before ``top`` cut each device's list); names as ``display`` shows them."""
        shown: dict[tuple[str, int], dict[str, _Name]] = {}
        for (host, device, name), totals in self.names.items():
            shown.setdefault((host, device), {}).setdefault(display(name), _Name()).merge(totals)
        rows: list[list[Any]] = []
        total = 0
        for (host, device), names in sorted(shown.items()):
            ranked = sorted(names.items(), key=lambda kv: (-kv[1].rank(), kv[0]))
            total += len(ranked)
            for name, n in ranked[:top] if top is not None else ranked:
                rows += [[host, device, name, n.launches, n.passes, m, n.mean(m)] for m in n.weighted]
        return rows, total
