"""PM sampling's per-interval statistics (``PmStats``) as OTLP gauges, one point per interval, device
and metric: the interval's mean, at the interval's end.

Names follow the OpenTelemetry hardware conventions where one fits: the activity percentages
(DCGM's ``*_ACTIVE`` profiling fields) are ``hw.gpu.utilization`` with ``hw.gpu.task`` naming the
unit that was active (``sm``, ``tensor``, ``dram``, ...), as a fraction; the conventions' ``general``
task stays the kernel-busy utilization of ``hw``. What they lack is under ``cuda.device.*``: SM
occupancy, PCIe and NVLink throughput (bytes per second, with ``cuda.link.direction``), and any
configured metric outside the default set (``cuda.device.pm.value``, in the metric's own unit).
Every point names its CUPTI metric in ``cuda.pm.metric``. A NaN mean (no value in the interval) is
not sent.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from cuptistream.cupti.pm_metrics import field_of, unit_of
from cuptistream.events import PmStats

from .metrics import DEV, GPU, MetricDef

UTILIZATION = "hw.gpu.utilization"
# DCGM field (pm_metrics.DEFAULT_FIELDS) -> hw.gpu.task
TASKS = {
    "gr_engine_active": "graphics_engine", "sm_active": "sm", "tensor_active": "tensor",
    "tensor_hmma_active": "tensor_hmma", "tensor_imma_active": "tensor_imma",
    "tensor_dmma_active": "tensor_dmma", "fp64_active": "fp64", "fp32_active": "fp32",
    "fp16_active": "fp16", "dram_active": "dram",
}  # fmt: skip
# DCGM field -> (metric, cuda.link.direction)
LINKS = {
    "pcie_rx_bytes": ("cuda.device.pcie.throughput", "receive"),
    "pcie_tx_bytes": ("cuda.device.pcie.throughput", "transmit"),
    "nvlink_rx_bytes": ("cuda.device.nvlink.throughput", "receive"),
    "nvlink_tx_bytes": ("cuda.device.nvlink.throughput", "transmit"),
}
_PM = ("cuda.pm.metric",)
PM_METRICS: dict[str, MetricDef] = {
    d.name: d
    for d in [
        MetricDef("cuda.device.sm.occupancy", "1", "Warps active per SM over the maximum (PM sampling)",
                  (*GPU, *_PM), kind="gauge"),
        MetricDef("cuda.device.pcie.throughput", "By/s", "PCIe bytes per second (PM sampling)",
                  (*GPU, "cuda.link.direction", *_PM), kind="gauge"),
        MetricDef("cuda.device.nvlink.throughput", "By/s", "NVLink bytes per second (PM sampling)",
                  (*GPU, "cuda.link.direction", *_PM), kind="gauge"),
        MetricDef("cuda.device.pm.value", "1", "A configured PM sampling metric, in its own unit",
                  (*GPU, *_PM), kind="gauge"),
    ]
}  # fmt: skip

Reading = tuple[str, dict[str, object], float]  # metric, attributes beyond the device's, value


def pm_readings(ev: PmStats) -> Iterator[Reading]:
    """The gauge readings of one interval's statistics."""
    for metric, mean in zip(ev.metrics, ev.mean, strict=True):
        if mean is None or math.isnan(mean):
            continue
        field = field_of(metric) or ""
        fraction = mean / 100 if unit_of(metric) == "%" else mean
        if field in TASKS:
            yield UTILIZATION, {"hw.gpu.task": TASKS[field], "cuda.pm.metric": metric}, fraction
        elif field == "sm_occupancy":
            yield "cuda.device.sm.occupancy", {"cuda.pm.metric": metric}, fraction
        elif field in LINKS:
            name, direction = LINKS[field]
            yield name, {"cuda.link.direction": direction, "cuda.pm.metric": metric}, mean
        else:
            yield "cuda.device.pm.value", {"cuda.pm.metric": metric}, mean


__all__ = ["DEV", "PM_METRICS", "pm_readings"]
