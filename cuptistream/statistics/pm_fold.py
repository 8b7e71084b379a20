"""PM sampling's hardware counters folded per interval: per device and metric, the mean and the 5th,
50th and 95th percentiles of the samples that ended in each interval (``PmStats``).

A sample belongs to the interval its end falls in, as a kernel does in ``ActivityStats``. An interval
is closed once a sample of its device ends ``LATENESS_NS`` past it (samples of one device come in
time order, decode after decode) or at ``close()``. A change of metric list on a device (a new
session) closes what it had. Values are held per open interval only: at a 20 ms interval and a 10 s
statistics interval, 500 samples per metric and device.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from cuptistream.events import PmSamples, PmStats, nan_as_none
from cuptistream.statistics.accumulator import LATENESS_NS


@dataclass
class _Open:
    metrics: tuple[str, ...]
    intervals: dict[int, list[np.ndarray]] = field(default_factory=dict)  # start -> (metrics, n) blocks


class PmFold:
    """Folds ``PmSamples`` events into ``PmStats`` per ``interval_ns``. Not thread-safe."""

    def __init__(self, interval_ns: int) -> None:
        if interval_ns <= 0:
            raise ValueError("interval_ns must be positive")
        self.interval_ns = interval_ns
        self._devices: dict[int, _Open] = {}

    def add(self, samples: PmSamples) -> list[PmStats]:
        """Take one event's samples; returns the intervals they closed. ValueError: columns whose
        lengths do not match."""
        count = len(samples.ends)
        if (
            len(samples.starts) != count
            or len(samples.values) != len(samples.metrics)
            or any(len(column) != count for column in samples.values)
        ):
            raise ValueError(f"pm_samples of device {samples.device_id}: columns of unequal length")
        out: list[PmStats] = []
        metrics = tuple(samples.metrics)
        device = self._devices.get(samples.device_id)
        if device is not None and device.metrics != metrics:
            out += self._close(samples.device_id, device, None)
            device = None
        if device is None:
            device = self._devices[samples.device_id] = _Open(metrics)
        if count == 0:
            return out
        ends = np.asarray(samples.ends, dtype=np.int64)
        values = np.asarray(samples.values, dtype=np.float64).reshape(len(metrics), count)
        starts = ends - ends % self.interval_ns
        for start in np.unique(starts).tolist():
            device.intervals.setdefault(start, []).append(values[:, starts == start])
        out += self._close(samples.device_id, device, int(ends.max()) - LATENESS_NS)
        return out

    def close(self) -> list[PmStats]:
        """Every interval still open, as statistics (the end of a session)."""
        out: list[PmStats] = []
        for device_id, device in list(self._devices.items()):
            out += self._close(device_id, device, None)
        self._devices.clear()
        return out

    def _close(self, device_id: int, device: _Open, before: int | None) -> list[PmStats]:
        """The intervals of ``device`` that end by ``before`` (all: None), as statistics."""
        out = []
        for start in sorted(device.intervals):
            end = start + self.interval_ns
            if before is not None and end > before:
                break
            blocks = device.intervals.pop(start)
            out.append(self._stats(device_id, device.metrics, start, end, np.concatenate(blocks, axis=1)))
        return out

    @staticmethod
    def _stats(device_id: int, metrics: tuple[str, ...], start: int, end: int, values: np.ndarray) -> PmStats:
        # NaN (a metric CUPTI could not evaluate for a sample) is left out of that metric's figures.
        with warnings.catch_warnings():  # a metric that is NaN throughout: NaN, said once per metric
            warnings.simplefilter("ignore", RuntimeWarning)
            p5, p50, p95 = np.nanpercentile(values, [5, 50, 95], axis=1)
            mean = np.nanmean(values, axis=1)
        return PmStats(
            interval_start=start,
            interval_end=end,
            device_id=device_id,
            samples=int(values.shape[1]),
            metrics=list(metrics),
            mean=nan_as_none(mean),
            p5=nan_as_none(p5),
            p50=nan_as_none(p50),
            p95=nan_as_none(p95),
        )
