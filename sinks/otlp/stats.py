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

from collections import deque
from collections.abc import Callable
from typing import Any

from opentelemetry.proto.metrics.v1.metrics_pb2 import ExponentialHistogramDataPoint, NumberDataPoint

from cuptistream.events import ActivityStats, Batch, GpuStats

from .common import key_values
from .metrics import DEV, MAX_READINGS, OTHER, MetricDef, NameCap

StatsPoint = tuple[str, NumberDataPoint | ExponentialHistogramDataPoint]
_STATS_TYPES = frozenset({ActivityStats, GpuStats})

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
    ]
}


class StatsPoints:
    """The statistics points of one observed process, held until a metrics export is acknowledged.

    ``hw_id`` gives a device's ``hw.id`` (its UUID) as the raw-record metrics name it.
    """

    def __init__(self, kernel_names: NameCap, hw_id: Callable[[int], str]) -> None:
        self.kernel_names = kernel_names
        self.hw_id = hw_id
        self.held: deque[StatsPoint] = deque(maxlen=MAX_READINGS)
        self.overflowed = 0  # points dropped, oldest first, while the backend was away

    def add(self, batch: Batch) -> None:
        offset = batch.clock.offset_ns
        for ev in batch.events:
            if type(ev) not in _STATS_TYPES:  # one cheap test: most batches are raw records
                continue
            if isinstance(ev, ActivityStats):
                if ev.category in _NAME_KEY:
                    self._activity(ev, ev.interval_start + offset, ev.interval_end + offset)
            elif isinstance(ev, GpuStats):
                self._gpu(ev, ev.interval_start + offset, ev.interval_end + offset)

    def _activity(self, ev: ActivityStats, start: int, end: int) -> None:
        name = ev.name
        if ev.category == "kernel" and name != OTHER:  # the collector's own ``other`` takes no slot
            name = self.kernel_names(name, ev.count)
        labels: dict[str, Any] = {_NAME_KEY[ev.category]: name, DEV: ev.device_id}
        if ev.category == "kernel":
            labels["cuda.kernel.nccl"] = ev.nccl
        p = f"cuda.{ev.category}"
        self._histogram(f"{p}.traced.duration", labels, ev, start, end)
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
            self._number(f"{p}.{suffix}", labels, value, start, end)

    def _gpu(self, ev: GpuStats, start: int, end: int) -> None:
        device = {"hw.id": self.hw_id(ev.device_id), DEV: ev.device_id}
        self._number("cuda.device.busy_ratio", device, ev.busy_fraction, None, end)
        self._number("cuda.device.traced_ratio", device, ev.traced_fraction, None, end)
        for kind, ns in (("kernel", ev.kernel_ns), ("memcpy", ev.copy_ns), ("memset", ev.memset_ns)):
            labels = {**device, "cuda.activity.kind": kind}
            self._number("cuda.device.activity.time", labels, ns / 1e9, start, end)
        self._number("cuda.device.nccl.time", device, ev.nccl_ns / 1e9, start, end)

    def _number(
        self, name: str, labels: dict[str, Any], value: int | float, start: int | None, end: int
    ) -> None:
        point = NumberDataPoint(attributes=key_values(labels), time_unix_nano=end)
        if isinstance(value, float):
            point.as_double = value
        else:
            point.as_int = value
        if start is not None:  # a gauge reading has no start
            point.start_time_unix_nano = start
        self._hold(name, point)

    def _histogram(self, name: str, labels: dict[str, Any], ev: ActivityStats, start: int, end: int) -> None:
        h = ev.durations
        point = ExponentialHistogramDataPoint(
            attributes=key_values(labels),
            start_time_unix_nano=start,
            time_unix_nano=end,
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
        self._hold(name, point)

    def _hold(self, name: str, point: NumberDataPoint | ExponentialHistogramDataPoint) -> None:
        if len(self.held) == self.held.maxlen:
            self.overflowed += 1
        self.held.append((name, point))

    def export(self) -> list[StatsPoint]:
        """Every point held; ``commit`` them once the receiver acknowledged them."""
        return list(self.held)

    def commit(self, exported: list[StatsPoint]) -> None:
        sent = {id(p) for p in exported}
        while self.held and id(self.held[0]) in sent:
            self.held.popleft()
