"""The collector's statistics (``ActivityStats``, ``GpuStats``) → OTLP metrics with DELTA temporality.

Each statistics event already covers one interval, so it becomes points of its own (start = the
interval's start, time = its end, in epoch ns through the batch's clock), not a change to a
cumulative series. The points are held until a metrics export is acknowledged, like the gauge
readings in ``metrics``: a failed request loses nothing, it is sent again with the next batch.

* ``cuda.{kernel,memcpy,memset}.traced.duration``: the event's duration histogram as an OTLP
  ExponentialHistogram, bucket for bucket. Its unit is ``ns``, not the conventions' ``s``: base-2
  bucket bounds in ns are not bucket bounds in seconds (1e-9 is not a power of 2), so converting
  would move counts between buckets. Sums of time are in seconds as everywhere else.
* ``cuda.*.traced.{count,time,bytes}``: what was traced; ``cuda.*.estimated.{count,time,bytes}``:
  the same scaled to the whole interval. Estimates are separate metrics (not an attribute), so
  summing a metric over its attributes never adds an estimate to a measurement.
* ``cuda.device.{busy_ratio,traced_ratio}`` gauges and ``cuda.device.{activity,nccl}.time`` sums.

Kernel names share the process's ``max_kernel_names`` cap (``metrics.NameCap``) with the raw-record
metrics; ``cuda.kernel.nccl`` keeps NCCL time apart even under ``other``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.metrics.v1.metrics_pb2 import ExponentialHistogramDataPoint, NumberDataPoint

from cuptistream.events import ActivityStats, Batch, GpuStats, PmStats

from .common import key_values
from .metrics import DEV, MAX_READINGS, OTHER, MetricDef, NameCap
from .pm import PM_METRICS, pm_readings

StatsPoint = tuple[str, NumberDataPoint | ExponentialHistogramDataPoint]
_STATS_TYPES = frozenset({ActivityStats, GpuStats, PmStats})
_Key = tuple[str, tuple[tuple[str, Any], ...], tuple[int, int]]  # metric, attributes, CUPTI interval

# The attribute that names a statistics row, per category (the same keys as the raw-record metrics).
_NAME_KEY = {"kernel": "cuda.kernel.name", "memcpy": "cuda.memcpy.kind", "memset": "cuda.memset.memory_kind"}
_COUNT_UNIT = {"kernel": "{kernel}", "memcpy": "{copy}", "memset": "{memset}"}
_WHAT = {"kernel": "kernels", "memcpy": "copies", "memset": "memsets"}


_ESTIMATED = "estimated for the whole interval from its traced part"


def _activity_defs(category: str) -> list[MetricDef]:
    keys = (_NAME_KEY[category], DEV) + (("cuda.kernel.nccl",) if category == "kernel" else ())
    what, count_unit, p = _WHAT[category], _COUNT_UNIT[category], f"cuda.{category}"
    defs = [
        MetricDef(f"{p}.traced.duration", "ns", f"Durations of traced {what}", keys, "histogram", delta=True),
        MetricDef(f"{p}.traced.count", count_unit, f"Traced {what}", keys, delta=True),
        MetricDef(f"{p}.traced.time", "s", f"GPU time of traced {what}", keys, seconds=True, delta=True),
        MetricDef(f"{p}.estimated.count", count_unit, f"{what}, {_ESTIMATED}", keys, delta=True),
        MetricDef(
            f"{p}.estimated.time", "s", f"GPU time of {what}, {_ESTIMATED}", keys, seconds=True, delta=True
        ),
    ]
    if category != "kernel":
        defs.append(MetricDef(f"{p}.traced.bytes", "By", f"Bytes of traced {what}", keys, delta=True))
        defs.append(
            MetricDef(f"{p}.estimated.bytes", "By", f"Bytes of {what}, {_ESTIMATED}", keys, delta=True)
        )
    return defs


_DEVICE = ("hw.id", DEV)
_BUSY = "Fraction of the traced time in which a kernel, copy or memset of this process ran"
STATS_METRICS: dict[str, MetricDef] = {
    d.name: d
    for d in [
        *(d for category in _NAME_KEY for d in _activity_defs(category)),
        MetricDef("cuda.device.busy_ratio", "1", _BUSY, _DEVICE, kind="gauge"),
        MetricDef("cuda.device.traced_ratio", "1", "Fraction of the interval traced", _DEVICE, kind="gauge"),
        MetricDef(
            "cuda.device.activity.time",
            "s",
            "GPU time of traced kernels, copies and memsets (overlapping ones count each)",
            (*_DEVICE, "cuda.activity.kind"),
            seconds=True,
            delta=True,
        ),
        MetricDef(
            "cuda.device.nccl.time", "s", "GPU time of traced NCCL kernels", _DEVICE, seconds=True, delta=True
        ),
        *PM_METRICS.values(),
    ]
}


@dataclass(frozen=True)
class _Interval:
    cupti: tuple[int, int]  # as the collector gave it: the identity of the interval
    start: int  # epoch ns, through the clock of the batch that first carried it
    end: int


class StatsPoints:
    """The statistics points of one observed process, held until a metrics export is acknowledged.

    Points are keyed by metric, attributes and interval: two delta points of one series and
    interval would be duplicates, so a repeat (names the sink's cap folds into ``other``) merges
    into the held point. An ``other`` point waits until a later interval's statistics arrive (or
    ``finish``), so the rows folded into it that come in later batches still merge before it is sent.
    ``hw_id`` gives a device's ``hw.id`` (its UUID) as the raw-record metrics name it; ``gpu`` its
    ``hw.*`` attributes (``metrics.GPU``) for the hardware-utilization gauges (``pm``).
    """

    def __init__(
        self, kernel_names: NameCap, hw_id: Callable[[int], str],
        gpu: Callable[[int], dict[str, Any]] | None = None,
    ) -> None:  # fmt: skip
        self.kernel_names = kernel_names
        self.hw_id = hw_id
        self.gpu = gpu or (lambda device_id: {"hw.id": hw_id(device_id), DEV: device_id})
        self.held: dict[_Key, NumberDataPoint | ExponentialHistogramDataPoint] = {}
        self.waiting: set[_Key] = set()  # ``other`` points of intervals not known to be complete
        self.latest_end = 0  # the latest interval end seen (CUPTI clock)
        self.final = False
        self.overflowed = 0  # points dropped, oldest first, past MAX_READINGS while the backend was away
        self._epoch: dict[tuple[int, int], _Interval] = {}  # the intervals of the points held

    def add(self, batch: Batch) -> None:
        offset = batch.clock.offset_ns
        for ev in batch.events:
            if type(ev) not in _STATS_TYPES:  # one cheap test: most batches are raw records
                continue
            if isinstance(ev, GpuStats):
                self._gpu(ev, self._interval(ev, offset))
            elif isinstance(ev, ActivityStats) and ev.category in _NAME_KEY:
                self._activity(ev, self._interval(ev, offset))
            elif isinstance(ev, PmStats):
                interval = self._interval(ev, offset)
                for name, extra, value in pm_readings(ev):
                    self._number(name, {**self.gpu(ev.device_id), **extra}, value, interval, gauge=True)

    def _interval(self, ev: ActivityStats | GpuStats | PmStats, offset: int) -> _Interval:
        cupti = (ev.interval_start, ev.interval_end)
        self.latest_end = max(self.latest_end, ev.interval_end)
        # One epoch time per interval, whatever clock sync later batches carry.
        return self._epoch.setdefault(cupti, _Interval(cupti, cupti[0] + offset, cupti[1] + offset))

    def finish(self) -> None:
        """Send every point at the next export (the process ended or the sink is closing)."""
        self.final = True

    def _activity(self, ev: ActivityStats, interval: _Interval) -> None:
        name = ev.name
        if ev.category == "kernel" and name != OTHER:  # the collector's own ``other`` takes no slot
            name = self.kernel_names(name, ev.count)
        labels: dict[str, Any] = {_NAME_KEY[ev.category]: name, DEV: ev.device_id}
        if ev.category == "kernel":
            labels["cuda.kernel.nccl"] = ev.nccl
        p = f"cuda.{ev.category}"
        self._histogram(f"{p}.traced.duration", labels, ev, interval)
        # Unless ``estimated``, the whole interval was traced and the estimates are the measurements
        # (whatever the event's estimated_* hold), so ``*.estimated.*`` serves both modes.
        scaled = ev.estimated
        values: list[tuple[str, int | float]] = [
            ("traced.count", ev.count),
            ("traced.time", ev.total_ns / 1e9),
            ("estimated.count", ev.estimated_count if scaled else ev.count),
            ("estimated.time", (ev.estimated_total_ns if scaled else ev.total_ns) / 1e9),
        ]
        if ev.category != "kernel":
            values.append(("traced.bytes", ev.bytes))
            values.append(("estimated.bytes", ev.estimated_bytes if scaled else ev.bytes))
        for suffix, value in values:
            self._number(f"{p}.{suffix}", labels, value, interval)

    def _gpu(self, ev: GpuStats, interval: _Interval) -> None:
        device = {"hw.id": self.hw_id(ev.device_id), DEV: ev.device_id}
        self._number("cuda.device.busy_ratio", device, ev.busy_fraction, interval, gauge=True)
        self._number("cuda.device.traced_ratio", device, ev.traced_fraction, interval, gauge=True)
        for kind, ns in (("kernel", ev.kernel_ns), ("memcpy", ev.copy_ns), ("memset", ev.memset_ns)):
            labels = {**device, "cuda.activity.kind": kind}
            self._number("cuda.device.activity.time", labels, ns / 1e9, interval)
        self._number("cuda.device.nccl.time", device, ev.nccl_ns / 1e9, interval)

    def _number(
        self, name: str, labels: dict[str, Any], value: int | float, interval: _Interval, gauge: bool = False
    ) -> None:
        key = (name, tuple(labels.items()), interval.cupti)
        held = self.held.get(key)
        if isinstance(held, NumberDataPoint) and not gauge:  # a repeat of a delta point: add
            if held.WhichOneof("value") == "as_int" and isinstance(value, int):
                held.as_int += value
            else:
                held.as_double = _number_value(held) + value
            return
        point = NumberDataPoint(attributes=key_values(labels), time_unix_nano=interval.end)
        if isinstance(value, float):
            point.as_double = value
        else:
            point.as_int = value
        if not gauge:  # a gauge reading has no start (and a repeated one replaces it)
            point.start_time_unix_nano = interval.start
        self._hold(key, point, labels)

    def _histogram(self, name: str, labels: dict[str, Any], ev: ActivityStats, interval: _Interval) -> None:
        h = ev.durations
        point = ExponentialHistogramDataPoint(
            attributes=key_values(labels),
            start_time_unix_nano=interval.start,
            time_unix_nano=interval.end,
            # OTLP requires count == zero_count + the buckets' sum: take it from the buckets.
            count=h.zero_count + sum(h.counts),
            sum=float(ev.total_ns),
            scale=h.scale,
            zero_count=h.zero_count,
        )
        point.positive.offset = h.offset
        point.positive.bucket_counts.extend(h.counts)
        if point.count:  # min and max are optional: leave them out of an empty histogram
            point.min, point.max = float(h.min), float(h.max)
        key = (name, tuple(labels.items()), interval.cupti)
        held = self.held.get(key)
        if isinstance(held, ExponentialHistogramDataPoint):
            merge(held, point)
            return
        self._hold(key, point, labels)

    def _hold(
        self, key: _Key, point: NumberDataPoint | ExponentialHistogramDataPoint, labels: dict[str, Any]
    ) -> None:
        if key not in self.held and len(self.held) >= MAX_READINGS:
            oldest = next(iter(self.held))
            del self.held[oldest]
            self.waiting.discard(oldest)
            self.overflowed += 1
        self.held[key] = point
        if labels.get("cuda.kernel.name") == OTHER:
            self.waiting.add(key)

    def export(self) -> list[StatsPoint]:
        """The points ready to send; ``commit`` them once the receiver acknowledged them."""
        return [(key[0], point) for key, point in self.held.items() if self._ready(key)]

    def _ready(self, key: _Key) -> bool:
        return self.final or key not in self.waiting or key[2][1] < self.latest_end

    def commit(self, exported: list[StatsPoint]) -> None:
        sent = {id(point) for _, point in exported}
        for key in [k for k, point in self.held.items() if id(point) in sent]:
            del self.held[key]
            self.waiting.discard(key)
        # Keep the epoch times of intervals still held or still current: all of an interval's
        # points then carry the same times.
        keep = {key[2] for key in self.held}
        self._epoch = {c: i for c, i in self._epoch.items() if c in keep or c[1] >= self.latest_end}


def _number_value(point: NumberDataPoint) -> float:
    return float(point.as_int if point.WhichOneof("value") == "as_int" else point.as_double)


def merge(into: ExponentialHistogramDataPoint, other: ExponentialHistogramDataPoint) -> None:
    """Add ``other`` to ``into``, at the coarser of their scales (OTLP's downscale: index >> n)."""
    scale = min(into.scale, other.scale)
    counts: dict[int, int] = {}
    for p in (into, other):
        shift = p.scale - scale
        for k, n in enumerate(p.positive.bucket_counts):
            if n:
                index = (p.positive.offset + k) >> shift
                counts[index] = counts.get(index, 0) + n
    if into.count and other.count:
        into.min, into.max = min(into.min, other.min), max(into.max, other.max)
    elif other.count:
        into.min, into.max = other.min, other.max
    into.count += other.count
    into.sum += other.sum
    into.zero_count += other.zero_count
    into.scale = scale
    low = min(counts, default=0)
    into.positive.offset = low
    del into.positive.bucket_counts[:]
    into.positive.bucket_counts.extend(counts.get(i, 0) for i in range(low, max(counts, default=-1) + 1))
