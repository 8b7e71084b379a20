"""The summary's GPU tables from the collector's statistics, for recordings without raw records
(``activity.records: on_demand``, or a recording of the statistics alone).

``StatisticsTotals`` folds ``ActivityStats`` and ``GpuStats`` events (light or full Structs); its
tables have the raw-record tables' names (``kernels``, ``memory``, ``gpu_busy``) and columns, plus
``estimated_*`` columns: where only part of an interval was traced, the statistics carry values
scaled to the whole interval, and the titles say which columns are estimates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MAX_I64 = (1 << 63) - 1


class StatisticsTotals:
    def __init__(self) -> None:
        # name -> [count, total_ns, min_ns, max_ns, estimated count, estimated ns, any estimated]
        self.kernels: dict[str, list[int]] = {}
        # (operation, kind) -> [count, bytes, ns, estimated count, estimated bytes, estimated ns]
        self.copies: dict[tuple[str, str], list[int]] = {}
        # (pid, device) -> [busy_ns, traced_ns, kernel_ns, nccl_ns, first, last, any estimated]
        self.devices: dict[tuple[int, int], list[int]] = {}

    def __bool__(self) -> bool:
        return bool(self.kernels or self.copies or self.devices)

    def activity(self, st: Any) -> None:
        if st.category == "kernel":
            row = self.kernels.setdefault(st.name, [0, 0, _MAX_I64, 0, 0, 0, 0])
            row[0] += st.count
            row[1] += st.total_ns
            row[2] = min(row[2], st.durations.min)
            row[3] = max(row[3], st.durations.max)
            row[4] += st.estimated_count
            row[5] += st.estimated_total_ns
            row[6] |= st.estimated
            return
        key = ("memcpy " + st.name, "") if st.category == "memcpy" else ("memset", st.name)
        row = self.copies.setdefault(key, [0, 0, 0, 0, 0, 0])
        for i, value in enumerate(
            (st.count, st.bytes, st.total_ns, st.estimated_count, st.estimated_bytes, st.estimated_total_ns)
        ):
            row[i] += value

    def device(self, pid: int, st: Any) -> None:
        row = self.devices.setdefault((pid, st.device_id), [0, 0, 0, 0, _MAX_I64, 0, 0])
        row[0] += st.busy_ns
        row[1] += st.traced_ns
        row[2] += st.kernel_ns
        row[3] += st.nccl_ns
        row[4] = min(row[4], st.interval_start)
        row[5] = max(row[5], st.interval_end)
        row[6] |= st.estimated

    def tables(
        self, display: Callable[[str], str], label: Callable[[int], str]
    ) -> list[tuple[str, str, list[str], list[list[Any]]]]:
        """(name, title, columns, rows) of the kernels, memory and gpu_busy tables, rows sorted."""
        kernels: dict[str, list[int]] = {}
        for name, row in self.kernels.items():  # two recorded names that demangle alike are one row
            shown = kernels.setdefault(display(name), [0, 0, _MAX_I64, 0, 0, 0, 0])
            for i in (0, 1, 4, 5):
                shown[i] += row[i]
            shown[2], shown[3], shown[6] = min(shown[2], row[2]), max(shown[3], row[3]), shown[6] | row[6]
        whole = sum(r[5] for r in kernels.values())
        kernel_rows = [
            [name, c, t, t // c if c else 0, lo if c else 0, hi, ec, et, et / whole if whole else 0.0,
             bool(est)]
            for name, (c, t, lo, hi, ec, et, est) in sorted(kernels.items(), key=lambda kv: -kv[1][5])
        ]  # fmt: skip
        memory_rows = [
            [op, kind, c, b, t, b / t if t else 0.0, ec, eb, et]
            for (op, kind), (c, b, t, ec, eb, et) in sorted(self.copies.items(), key=lambda kv: -kv[1][5])
        ]
        device_rows = [
            [pid, label(pid), device, busy, max(traced - busy, 0), traced, busy / traced if traced else 0.0,
             kernel, nccl, last - first, bool(est)]
            for (pid, device), (busy, traced, kernel, nccl, first, last, est) in sorted(self.devices.items())
        ]  # fmt: skip
        return [
            (
                "kernels",
                "Kernels by estimated GPU time (from the collector's statistics; estimated_* and share "
                "are scaled to whole intervals where only part was traced)",
                ["name", "count", "total_ns", "mean_ns", "min_ns", "max_ns", "estimated_count",
                 "estimated_total_ns", "share", "estimated"],
                kernel_rows,
            ),
            (
                "memory",
                "Memory copies and sets by kind (from the collector's statistics; estimated_* scaled)",
                ["operation", "kind", "count", "bytes", "total_ns", "gb_per_s", "estimated_count",
                 "estimated_bytes", "estimated_total_ns"],
                memory_rows,
            ),
            (
                "gpu_busy",
                "GPU busy per device while traced (from the collector's statistics; busy_share is an "
                "estimate for the whole run where estimated)",
                ["pid", "process", "device", "busy_ns", "idle_ns", "span_ns", "busy_share", "kernel_ns",
                 "nccl_ns", "intervals_ns", "estimated"],
                device_rows,
            ),
        ]  # fmt: skip
