"""Events → OTLP metrics: cumulative sums per observed process, with capped name cardinality.

Counters are monotonic cumulative Sums whose start time is when the sink first saw the process;
up-down counters (``hw.gpu.memory.*``) are non-monotonic cumulative Sums; gauges carry the latest
reading. A request carries only the series that changed since the last *successful* export, so a
failed metrics request loses nothing: its series stay dirty and the next request carries their
cumulative values. Durations are kept in ns and sent in seconds (the conventions' unit).
The GPU readings of the environment events and the utilization windows are in ``otlp_hw``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    ExponentialHistogramDataPoint,
    Metric,
    NumberDataPoint,
)

from cuptistream.events import (
    Batch,
    Device,
    Environment,
    Kernel,
    Loss,
    Memcpy,
    MemoryAllocation,
    Memset,
    PcSampleBatch,
    SassMetricBatch,
    SelfStats,
)

from .common import key_values
from .hw import BusyWindows, environment_readings

OTHER = "other"
NVIDIA = "NVIDIA"  # hw.vendor: CUPTI sees NVIDIA GPUs only


@dataclass(frozen=True)
class MetricDef:
    name: str
    unit: str
    description: str
    keys: tuple[str, ...]  # attribute keys, in the order of a series' key tuple
    # The conventions' instruments; a histogram is sent as an OTLP ExponentialHistogram.
    kind: Literal["counter", "updowncounter", "gauge", "histogram"] = "counter"
    seconds: bool = False  # kept in ns, sent as a double in seconds
    delta: bool = False  # each point covers its own interval (the statistics), not the session so far

    @property
    def gauge(self) -> bool:
        return self.kind == "gauge"


def _defs(*defs: MetricDef) -> dict[str, MetricDef]:
    return {d.name: d for d in defs}


DEV = "cuda.device.id"
GPU = ("hw.id", "hw.model", "hw.vendor", DEV)  # the conventions' hw.gpu attributes, and the ordinal
METRICS = _defs(
    MetricDef(
        "cuda.kernel.duration", "s", "GPU time spent in kernels", ("cuda.kernel.name", DEV), seconds=True
    ),
    MetricDef("cuda.kernel.count", "{kernel}", "Kernel executions", ("cuda.kernel.name", DEV)),
    MetricDef("cuda.memcpy.bytes", "By", "Bytes copied", ("cuda.memcpy.kind", DEV)),
    MetricDef(
        "cuda.memcpy.duration", "s", "GPU time spent in copies", ("cuda.memcpy.kind", DEV), seconds=True
    ),
    MetricDef("cuda.memcpy.count", "{copy}", "Copies", ("cuda.memcpy.kind", DEV)),
    MetricDef("cuda.memset.bytes", "By", "Bytes set", (DEV,)),
    MetricDef(
        "cuda.pc_sampling.samples",
        "{sample}",
        "PC samples by function and stall reason",
        ("cuda.function.name", "cuda.pc_sampling.stall_reason", DEV),
    ),
    MetricDef("cuda.pc_sampling.dropped", "{sample}", "PC samples the hardware dropped", (DEV,)),
    MetricDef(
        "cuda.sass.value",
        "1",
        "SASS metric values summed over instances",
        ("cuda.sass.metric", "cuda.function.name", DEV),
    ),
    MetricDef(
        "cuptistream.lost",
        "1",
        "Records lost anywhere in the pipeline",
        ("cuptistream.stage", "cuptistream.loss.reason", "cuptistream.loss.unit"),
    ),
    MetricDef(
        "cuptistream.stage.events",
        "{event}",
        "Events per pipeline stage",
        ("cuptistream.stage", "cuptistream.direction"),
    ),
    MetricDef(
        "cuptistream.stage.bytes",
        "By",
        "Bytes per pipeline stage",
        ("cuptistream.stage", "cuptistream.direction"),
    ),
    MetricDef(
        "cuptistream.stage.queued_bytes", "By", "Bytes queued now", ("cuptistream.stage",), kind="gauge"
    ),
    # OpenTelemetry hardware conventions (hw.gpu.*, hw.power, hw.temperature, hw.fan.*).
    MetricDef("hw.gpu.memory.limit", "By", "Size of the GPU memory", GPU, kind="updowncounter"),
    MetricDef(
        "hw.gpu.memory.usage",
        "By",
        "GPU memory this process holds through CUDA allocations seen by CUPTI",
        GPU,
        kind="updowncounter",
    ),
    MetricDef("hw.gpu.memory.utilization", "1", "Fraction of GPU memory used", GPU, kind="gauge"),
    MetricDef(
        "hw.gpu.utilization",
        "1",
        "Fraction of time one or more of this process's kernels ran",
        (*GPU, "hw.gpu.task"),
        kind="gauge",
    ),
    MetricDef("hw.power", "W", "GPU power draw", ("hw.id", "hw.type", DEV), kind="gauge"),
    MetricDef("hw.temperature", "Cel", "GPU temperature", ("hw.id", "hw.sensor_location", DEV), kind="gauge"),
    MetricDef(
        "hw.fan.speed_ratio",
        "1",
        "GPU fan speed, fraction of its maximum",
        ("hw.id", "hw.sensor_location", DEV),
        kind="gauge",
    ),
    # What the conventions lack for a GPU: cuda.device.*.
    MetricDef("cuda.device.power.limit", "W", "GPU power limit", ("hw.id", DEV), kind="gauge"),
    MetricDef("cuda.device.clock.sm", "Hz", "SM clock", ("hw.id", DEV), kind="gauge"),
    MetricDef("cuda.device.clock.memory", "Hz", "Memory clock", ("hw.id", DEV), kind="gauge"),
    MetricDef(
        "cuda.device.throttle_reasons",
        "1",
        "Clock throttle reasons, CUPTI's bit mask (CUpti_EnvironmentClocksThrottleReason)",
        ("hw.id", DEV),
        kind="gauge",
    ),
)

Series = tuple[str, tuple[object, ...]]  # metric name, attribute values
Exported = tuple[set[Series], list[tuple[Series, int | float, int]]]  # series and readings of an export
MAX_READINGS = 100_000


class NameCap:
    """The first ``limit`` distinct names keep their own series; later ones share ``other``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.names: set[str] = set()
        self.overflowed = 0  # events (or samples) counted under ``other``

    def __call__(self, name: str, weight: int = 1) -> str:
        if name in self.names:
            return name
        if len(self.names) < self.limit:
            self.names.add(name)
            return name
        self.overflowed += weight
        return OTHER


class MetricsAggregator:
    """The metrics of one observed process (one Resource)."""

    def __init__(
        self, max_kernel_names: int, max_function_names: int, clock: Callable[[], int] = time.time_ns
    ) -> None:
        self.kernel_names = NameCap(max_kernel_names)
        self.function_names = NameCap(max_function_names)
        self.clock = clock
        self.values: dict[Series, int | float] = {}
        self.dirty: set[Series] = set()
        # Gauge readings taken at a known time (environment samples, utilization windows): each is
        # its own point, kept until exported successfully (the oldest go beyond MAX_READINGS).
        self.readings: deque[tuple[Series, int | float, int]] = deque(maxlen=MAX_READINGS)
        self.start_ns = 0
        self.devices: dict[int, tuple[str, str]] = {}  # device id -> (uuid, model)
        self.memory_limit: dict[int, int] = {}
        self.busy = BusyWindows()

    def _add(self, name: str, key: tuple[object, ...], value: int) -> None:
        series = (name, key)
        self.values[series] = self.values.get(series, 0) + value
        self.dirty.add(series)

    def _set(self, name: str, key: tuple[object, ...], value: int | float) -> None:
        series = (name, key)
        if self.values.get(series) != value or series not in self.values:
            self.values[series] = value
            self.dirty.add(series)

    def _read(self, name: str, key: tuple[object, ...], value: int | float, at: int) -> None:
        self.readings.append(((name, key), value, at))

    def _gpu(self, device_id: int) -> tuple[object, ...]:
        """Values of ``GPU`` for a device: hw.id is its UUID (an ordinal where CUPTI gave none)."""
        uuid, model = self.devices.get(device_id, ("", ""))
        return (uuid or f"cuda:{device_id}", model or None, NVIDIA, device_id)

    def hw_id(self, device_id: int) -> str:
        return str(self._gpu(device_id)[0])

    def gpu(self, device_id: int) -> dict[str, object]:
        """The ``GPU`` attributes of a device, by name."""
        return dict(zip(GPU, self._gpu(device_id), strict=True))

    def add(self, batch: Batch) -> None:
        if not self.start_ns:
            self.start_ns = min(batch.clock.unix_ns, self.clock())
        for dev in batch.resource.devices:
            self.devices[dev.device_id] = (dev.uuid, dev.name)
        offset = batch.clock.offset_ns
        add = self._add
        busy: dict[int, list[tuple[int, int]]] = {}
        for ev in batch.events:
            if isinstance(ev, Kernel):
                key = (self.kernel_names(ev.name), ev.device_id)
                add("cuda.kernel.duration", key, ev.end - ev.start)
                add("cuda.kernel.count", key, 1)
                busy.setdefault(ev.device_id, []).append((ev.start + offset, ev.end + offset))
            elif isinstance(ev, Memcpy):
                key = (ev.copy_kind, ev.device_id)
                add("cuda.memcpy.bytes", key, ev.bytes)
                add("cuda.memcpy.duration", key, ev.end - ev.start)
                add("cuda.memcpy.count", key, 1)
            elif isinstance(ev, Memset):
                add("cuda.memset.bytes", (ev.device_id,), ev.bytes)
            elif isinstance(ev, PcSampleBatch):
                for sample in ev.samples:
                    for reason, count in sample.stalls.items():
                        fn = self.function_names(sample.function_name, count)
                        add("cuda.pc_sampling.samples", (fn, reason, ev.device_id), count)
                if ev.dropped_samples:
                    add("cuda.pc_sampling.dropped", (ev.device_id,), ev.dropped_samples)
            elif isinstance(ev, SassMetricBatch):
                for record in ev.records:
                    for metric, values in record.values.items():
                        fn = self.function_names(record.function_name)
                        add("cuda.sass.value", (metric, fn, ev.device_id), sum(values))
            elif isinstance(ev, Loss):
                add("cuptistream.lost", (ev.stage, ev.reason, ev.unit), ev.count)
            elif isinstance(ev, SelfStats):  # already cumulative: report as given
                for stage, st in ev.stages.items():
                    for direction, value in (("in", st.events_in), ("out", st.events_out)):
                        self._set("cuptistream.stage.events", (stage, direction), value)
                    self._set("cuptistream.stage.events", (stage, "dropped"), st.events_dropped)
                    for direction, value in (("in", st.bytes_in), ("out", st.bytes_out)):
                        self._set("cuptistream.stage.bytes", (stage, direction), value)
                    self._set("cuptistream.stage.queued_bytes", (stage,), st.queued_bytes)
            elif isinstance(ev, Device):
                self.devices[ev.device_id] = (ev.uuid, ev.name)
                if ev.global_memory_bytes:
                    self.memory_limit[ev.device_id] = ev.global_memory_bytes
                    self._set("hw.gpu.memory.limit", self._gpu(ev.device_id), ev.global_memory_bytes)
            elif isinstance(ev, MemoryAllocation) and ev.memory_kind == "device":
                gpu = self._gpu(ev.device_id)
                add("hw.gpu.memory.usage", gpu, ev.bytes if ev.operation == "alloc" else -ev.bytes)
                limit = self.memory_limit.get(ev.device_id)
                if limit:
                    used = self.values[("hw.gpu.memory.usage", gpu)]
                    self._read("hw.gpu.memory.utilization", gpu, used / limit, ev.timestamp + offset)
            elif isinstance(ev, Environment):
                hw_id = self._gpu(ev.device_id)[0]
                for name, extra, reading in environment_readings(ev):
                    labels = {"hw.id": hw_id, **extra, DEV: ev.device_id}
                    values_key = tuple(labels.get(k) for k in METRICS[name].keys)
                    self._read(name, values_key, reading, ev.timestamp + offset)
        for device, intervals in busy.items():
            self.busy.add(device, intervals)
        self._utilization(final=False)

    def _utilization(self, final: bool) -> None:
        for device, end, fraction in self.busy.closed(final):
            self._read("hw.gpu.utilization", (*self._gpu(device), "general"), fraction, end)

    def finish(self) -> None:
        """Close every utilization window (the sink is closing)."""
        self._utilization(final=True)

    def export(self) -> tuple[list[tuple[str, NumberDataPoint]], Exported]:
        """A (metric name, point) per series changed since the last ``commit`` and per reading held,
        and what to pass to ``commit`` once they are delivered."""
        now = self.clock()
        exported = set(self.dirty)
        points = [self._point(series, self.values[series], now) for series in sorted(exported, key=_sort_key)]
        points += [self._point(series, value, at) for series, value, at in self.readings]
        return points, (exported, list(self.readings))

    def _point(self, series: Series, value: int | float, at: int) -> tuple[str, NumberDataPoint]:
        name, key = series
        d = METRICS[name]
        point = NumberDataPoint(
            attributes=key_values(dict(zip(d.keys, key, strict=True))),  # type: ignore[arg-type]
            time_unix_nano=at,
        )
        if d.seconds:
            point.as_double = value / 1e9
        elif isinstance(value, float):
            point.as_double = value
        else:
            point.as_int = value
        if not d.gauge:
            point.start_time_unix_nano = self.start_ns
        return name, point

    def commit(self, exported: Exported) -> None:
        """Those points reached the backend; they need not be sent again (until a series changes)."""
        series, readings = exported
        self.dirty -= series
        sent = {id(r) for r in readings}
        while self.readings and id(self.readings[0]) in sent:
            self.readings.popleft()


def _sort_key(series: Series) -> tuple[str, str]:
    return series[0], repr(series[1])


def metrics_message(
    points: Sequence[tuple[str, NumberDataPoint | ExponentialHistogramDataPoint]],
    defs: Mapping[str, MetricDef] = METRICS,
) -> list[Metric]:
    """Group points into one Metric per name (the items of a request are points, so splitting
    a large request and counting partial successes both work in data points)."""
    by_name: dict[str, Metric] = {}
    for name, point in points:
        d = defs[name]
        metric = by_name.get(name)
        if metric is None:
            metric = by_name[name] = Metric(name=name, unit=d.unit, description=d.description)
            temporality = (
                AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
                if d.delta
                else AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
            )
            if d.kind == "histogram":
                metric.exponential_histogram.aggregation_temporality = temporality
            elif not d.gauge:
                metric.sum.aggregation_temporality = temporality
                metric.sum.is_monotonic = d.kind == "counter"
        if isinstance(point, ExponentialHistogramDataPoint):
            metric.exponential_histogram.data_points.append(point)
        else:
            (metric.gauge if d.gauge else metric.sum).data_points.append(point)
    return list(by_name.values())
