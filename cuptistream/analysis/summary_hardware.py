"""The summary's hardware-utilization table: per host, device and metric of PM sampling, the mean and
the 95th percentile over the recording or the selected span.

The collector's ``PmStats`` are the source where a device has them: the mean is the sample-weighted
mean of the intervals' means, the p95 the highest interval p95 (the figures the warehouse query
``hw_utilization.sql`` computes from the same rows). A device recorded with ``PmSamples`` alone (the
collector's statistics off) has its samples folded here as the collector folds them, at the default
statistics interval, so both routes mean the same. Counters belong to a device, not a process, so
rows are per host and device. An interval counts when it starts in the window, a sample likewise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cuptistream import events as ev
from cuptistream.config.model import StatisticsConfig
from cuptistream.cupti.pm_metrics import field_of, unit_of
from cuptistream.statistics.pm_fold import PmFold

COLUMNS = ["host", "device", "chip", "field", "metric", "unit", "intervals", "samples", "mean", "p95"]
TITLE = "Hardware utilization per device (PM sampling; mean over samples, p95 the highest interval p95)"
_Device = tuple[str, int]  # (host, device id)


@dataclass
class _Metric:
    intervals: int = 0
    samples: int = 0  # of intervals with a value for the metric
    weighted: float = 0.0  # sum of mean * samples
    p95: float = -math.inf

    def add(self, samples: int, mean: float | None, p95: float | None) -> None:
        if mean is None or math.isnan(mean):  # no value in any sample of the interval
            return
        self.intervals += 1
        self.samples += samples
        self.weighted += mean * samples
        if p95 is not None and not math.isnan(p95):
            self.p95 = max(self.p95, p95)


class HardwareTotals:
    """Folds ``PmStats`` and ``PmSamples`` (light or full Structs) into the table's rows."""

    def __init__(self, interval_ns: int | None = None) -> None:
        self.interval_ns = interval_ns or StatisticsConfig().interval_ns
        self.stats: dict[_Device, dict[str, _Metric]] = {}  # from the collector's PmStats
        self.folded: dict[_Device, dict[str, _Metric]] = {}  # from PmSamples, folded here
        self.chips: dict[_Device, str] = {}
        self._folds: dict[str, PmFold] = {}  # per host: one CUPTI clock per host

    def __bool__(self) -> bool:
        return bool(self.stats or self.folded)

    def add_stats(self, host: str, st: Any) -> None:
        self._fold_in(self.stats, host, st)

    def add_samples(self, host: str, samples: Any, keep: Sequence[bool] | None = None) -> list[str]:
        """One event's samples (those ``keep`` marks, all where None); returns problems, if any."""
        starts, ends, values = samples.starts, samples.ends, samples.values
        if keep is not None:
            starts = [s for s, k in zip(starts, keep, strict=False) if k]
            ends = [e for e, k in zip(ends, keep, strict=False) if k]
            values = [[v for v, k in zip(column, keep, strict=False) if k] for column in values]
        self.chips[(host, samples.device_id)] = samples.chip
        event = ev.PmSamples(
            device_id=samples.device_id, chip=samples.chip, metrics=list(samples.metrics),
            starts=list(starts), ends=list(ends), values=[[_float(v) for v in c] for c in values],
        )  # fmt: skip
        fold = self._folds.setdefault(host, PmFold(self.interval_ns))
        try:
            closed = fold.add(event)
        except ValueError as error:
            return [f"pm_samples not summarized: {error}"]
        self._fold_all(host, closed)
        return []

    def rows(self) -> list[list[Any]]:
        for host, fold in self._folds.items():
            self._fold_all(host, fold.close())
        self._folds.clear()
        rows = []
        shown = {**self.folded, **self.stats}  # a device's own statistics win over a fold of its samples
        for (host, device), metrics in sorted(shown.items()):
            chip = self.chips.get((host, device), "")
            for metric, m in metrics.items():  # in the order the source listed them
                if not m.samples:
                    continue
                p95 = m.p95 if m.p95 != -math.inf else None
                rows.append([host, device, chip, field_of(metric) or "", metric, unit_of(metric), m.intervals,
                             m.samples, m.weighted / m.samples, p95])  # fmt: skip
        return rows

    def _fold_all(self, host: str, closed: Iterable[ev.PmStats]) -> None:
        for st in closed:
            self._fold_in(self.folded, host, st)

    @staticmethod
    def _fold_in(into: dict[_Device, dict[str, _Metric]], host: str, st: Any) -> None:
        metrics = into.setdefault((host, st.device_id), {})
        for metric, mean, p95 in zip(st.metrics, st.mean, st.p95, strict=True):
            metrics.setdefault(metric, _Metric()).add(st.samples, mean, p95)


def _float(value: float | None) -> float:
    return math.nan if value is None else value
