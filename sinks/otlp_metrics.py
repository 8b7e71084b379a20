"""Events → OTLP metrics: cumulative sums per session, with capped name cardinality.

Every metric is a monotonic cumulative Sum whose start time is when the sink first saw the
session (``cuptistream.stage.queued_bytes`` is the one Gauge). A request carries only the series
that changed since the last *successful* export, so a failed metrics request loses nothing: its
series stay dirty and the next request carries their (larger) cumulative values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Metric, NumberDataPoint

from cuptistream.events import Batch, Kernel, Loss, Memcpy, Memset, PcSampleBatch, SassMetricBatch, SelfStats

from .otlp_common import key_values

OTHER = "other"


@dataclass(frozen=True)
class MetricDef:
    name: str
    unit: str
    description: str
    keys: tuple[str, ...]  # attribute keys, in the order of a series' key tuple
    gauge: bool = False


def _defs(*defs: MetricDef) -> dict[str, MetricDef]:
    return {d.name: d for d in defs}


DEV = "cuda.device.id"
METRICS = _defs(
    MetricDef("cuda.kernel.duration", "ns", "GPU time spent in kernels", ("cuda.kernel.name", DEV)),
    MetricDef("cuda.kernel.count", "{kernel}", "Kernel executions", ("cuda.kernel.name", DEV)),
    MetricDef("cuda.memcpy.bytes", "By", "Bytes copied", ("cuda.memcpy.kind", DEV)),
    MetricDef("cuda.memcpy.duration", "ns", "GPU time spent in copies", ("cuda.memcpy.kind", DEV)),
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
    MetricDef("cuptistream.stage.queued_bytes", "By", "Bytes queued now", ("cuptistream.stage",), gauge=True),
)

Series = tuple[str, tuple[object, ...]]  # metric name, attribute values


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
    def __init__(
        self, max_kernel_names: int, max_function_names: int, clock: Callable[[], int] = time.time_ns
    ) -> None:
        self.kernel_names = NameCap(max_kernel_names)
        self.function_names = NameCap(max_function_names)
        self.clock = clock
        self.values: dict[Series, int] = {}
        self.dirty: set[Series] = set()
        self.start_ns = 0

    def _add(self, name: str, key: tuple[object, ...], value: int) -> None:
        series = (name, key)
        self.values[series] = self.values.get(series, 0) + value
        self.dirty.add(series)

    def _set(self, name: str, key: tuple[object, ...], value: int) -> None:
        series = (name, key)
        if self.values.get(series) != value or series not in self.values:
            self.values[series] = value
            self.dirty.add(series)

    def add(self, batch: Batch) -> None:
        if not self.start_ns:
            self.start_ns = min(batch.clock.unix_ns, self.clock())
        add = self._add
        for ev in batch.events:
            if isinstance(ev, Kernel):
                key = (self.kernel_names(ev.name), ev.device_id)
                add("cuda.kernel.duration", key, ev.end - ev.start)
                add("cuda.kernel.count", key, 1)
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

    def export(self) -> tuple[list[tuple[str, NumberDataPoint]], set[Series]]:
        """One (metric name, point) per series changed since the last ``commit``, and those series."""
        now = self.clock()
        exported = set(self.dirty)
        points = []
        for series in sorted(exported, key=_sort_key):
            name, key = series
            d = METRICS[name]
            point = NumberDataPoint(
                attributes=key_values(dict(zip(d.keys, key, strict=True))),  # type: ignore[arg-type]
                time_unix_nano=now,
                as_int=self.values[series],
            )
            if not d.gauge:
                point.start_time_unix_nano = self.start_ns
            points.append((name, point))
        return points, exported

    def commit(self, exported: set[Series]) -> None:
        """Those series reached the backend; they need not be sent again until they change."""
        self.dirty -= exported


def _sort_key(series: Series) -> tuple[str, str]:
    return series[0], repr(series[1])


def metrics_message(points: Sequence[tuple[str, NumberDataPoint]]) -> list[Metric]:
    """Group points into one Metric per name (the items of a request are points, so splitting
    a large request and counting partial successes both work in data points)."""
    by_name: dict[str, Metric] = {}
    for name, point in points:
        metric = by_name.get(name)
        if metric is None:
            d = METRICS[name]
            metric = by_name[name] = Metric(name=name, unit=d.unit, description=d.description)
            if not d.gauge:
                metric.sum.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
                metric.sum.is_monotonic = True
        (metric.gauge if METRICS[name].gauge else metric.sum).data_points.append(point)
    return list(by_name.values())
