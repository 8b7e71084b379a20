"""GPU hardware metrics in the OpenTelemetry hardware conventions (``hw.*``), from what CUPTI reports.

* ``hw.power``, ``hw.temperature``, ``hw.fan.speed_ratio`` and the ``cuda.device.*`` clocks come from
  the environment events (CUPTI's environment activity kind): each reading is a gauge point at the
  reading's own time.
* ``hw.gpu.memory.limit`` is the device's memory size (the device events); ``hw.gpu.memory.usage`` is
  the sum of this process's CUDA allocations minus frees that CUPTI reported (memory kind).
* ``hw.gpu.utilization`` is NVML's definition applied to the kernels CUPTI saw: the fraction of each
  ``UTILIZATION_WINDOW_NS`` window of event time in which at least one kernel ran. Overlapping
  kernels are merged within a batch; across batches the sum is capped at 1. A window is final once
  kernels ``UTILIZATION_GRACE_NS`` past its end have been seen (CUPTI delivers late), or at close.
"""

from __future__ import annotations

from collections.abc import Iterator

from cuptistream.events import Environment

UTILIZATION_WINDOW_NS = 1_000_000_000
UTILIZATION_GRACE_NS = 10 * UTILIZATION_WINDOW_NS

Reading = tuple[str, dict[str, object], float | int]  # metric, attributes beyond the device's, value


def environment_readings(ev: Environment) -> Iterator[Reading]:
    """The gauge readings one environment event carries (a sample carries one kind of reading)."""
    if ev.power_mw is not None:
        yield "hw.power", {"hw.type": "gpu"}, ev.power_mw / 1000
    if ev.power_limit_mw is not None:
        yield "cuda.device.power.limit", {}, ev.power_limit_mw / 1000
    if ev.temperature_c is not None:
        yield "hw.temperature", {"hw.sensor_location": "GPU"}, ev.temperature_c
    if ev.fan_speed_percent is not None:
        yield "hw.fan.speed_ratio", {"hw.sensor_location": "GPU"}, ev.fan_speed_percent / 100
    if ev.sm_clock_mhz is not None:
        yield "cuda.device.clock.sm", {}, ev.sm_clock_mhz * 1_000_000
    if ev.memory_clock_mhz is not None:
        yield "cuda.device.clock.memory", {}, ev.memory_clock_mhz * 1_000_000
    if ev.throttle_reasons is not None:
        yield "cuda.device.throttle_reasons", {}, ev.throttle_reasons


def merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of [start, end) intervals, as disjoint sorted intervals."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


class BusyWindows:
    """Kernel busy time per device and window of event time, for ``hw.gpu.utilization``."""

    def __init__(self, window_ns: int = UTILIZATION_WINDOW_NS, grace_ns: int = UTILIZATION_GRACE_NS) -> None:
        self.window_ns = window_ns
        self.grace_ns = grace_ns
        self.busy: dict[int, dict[int, int]] = {}  # device -> window index -> busy ns
        self.latest: dict[int, int] = {}  # device -> the latest kernel end seen (epoch ns)
        self.emitted: dict[int, int] = {}  # device -> the next window index not emitted yet

    def add(self, device: int, intervals: list[tuple[int, int]]) -> None:
        """One batch's kernels on ``device`` (epoch ns)."""
        windows = self.busy.setdefault(device, {})
        floor = self.emitted.get(device)
        w = self.window_ns
        for start, end in merged(intervals):
            self.latest[device] = max(self.latest.get(device, end), end)
            for index in range(start // w, (end - 1) // w + 1 if end > start else start // w + 1):
                if floor is not None and index < floor:
                    continue  # that window was already reported: too late for it
                overlap = min(end, (index + 1) * w) - max(start, index * w)
                if overlap > 0:
                    windows[index] = windows.get(index, 0) + overlap

    def closed(self, final: bool = False) -> list[tuple[int, int, float]]:
        """(device, window end in epoch ns, fraction busy) for windows now final, oldest first; idle
        windows between busy ones are reported as 0."""
        out: list[tuple[int, int, float]] = []
        w = self.window_ns
        for device, windows in self.busy.items():
            if not windows:
                continue
            limit = max(windows) + 1 if final else (self.latest[device] - self.grace_ns) // w
            first = self.emitted.get(device, min(windows))
            for index in range(first, limit):
                out.append((device, (index + 1) * w, min(1.0, windows.pop(index, 0) / w)))
            self.emitted[device] = max(first, limit)
        return out
