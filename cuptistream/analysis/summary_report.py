"""The summary's totals and the tables made from them: ``Totals`` holds what ``Summarizer`` (in
``summary``) has folded so far, ``Totals.report`` turns it into ``Table``s, which
``cuptistream.analysis.report`` renders as text, CSV or JSON.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cuptistream import events as ev
from cuptistream.analysis.aggregate import Groups, IntervalUnion, KeyIndex
from cuptistream.analysis.names import DisplayNames
from cuptistream.analysis.summary_hardware import COLUMNS as HARDWARE_COLUMNS
from cuptistream.analysis.summary_hardware import TITLE as HARDWARE_TITLE
from cuptistream.analysis.summary_hardware import HardwareTotals
from cuptistream.analysis.summary_kernel_hardware import COLUMNS as KERNEL_HARDWARE_COLUMNS
from cuptistream.analysis.summary_kernel_hardware import HIDDEN as KERNEL_HARDWARE_HIDDEN
from cuptistream.analysis.summary_kernel_hardware import NAME as KERNEL_HARDWARE
from cuptistream.analysis.summary_kernel_hardware import TITLE as KERNEL_HARDWARE_TITLE
from cuptistream.analysis.summary_kernel_hardware import KernelHardwareTotals
from cuptistream.analysis.summary_kernel_metrics import COLUMNS as KERNEL_METRICS_COLUMNS
from cuptistream.analysis.summary_kernel_metrics import NAME as KERNEL_METRICS
from cuptistream.analysis.summary_kernel_metrics import TITLE as KERNEL_METRICS_TITLE
from cuptistream.analysis.summary_kernel_metrics import KernelMetricsTotals
from cuptistream.analysis.summary_statistics import StatisticsTotals

_STALL_PREFIXES = ("smsp__pcsamp_warps_issue_stalled_", "smsp__pcsamp_")


def api_domain(name: str) -> str:
    """The domain of a CUDA API call by its name: runtime functions are ``cuda*``, driver ones
    ``cu*`` otherwise. The summary does not decode the domain field (a string per call)."""
    return "runtime" if name.startswith("cuda") else "driver"


def stall_name(reason: str) -> str:
    """``smsp__pcsamp_warps_issue_stalled_long_scoreboard`` -> ``long_scoreboard``."""
    for prefix in _STALL_PREFIXES:
        if reason.startswith(prefix):
            return reason[len(prefix) :]
    return reason


@dataclass
class Table:
    """One section of the summary. Column names carry their unit (``_ns``, ``bytes``, ``share``)."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[Any]]
    total_rows: int = 0  # rows before ``top`` cut the list
    hidden: frozenset[str] = frozenset()  # columns the text table leaves out (JSON and CSV have them)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass
class Report:
    meta: dict[str, Any]
    tables: list[Table] = field(default_factory=list)

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)


class Totals:
    """What the summary has folded so far, and the report made from it."""

    def __init__(self, *, mangled: bool = False) -> None:
        self.display = DisplayNames(mangled)  # kernel and function names as the tables show them
        self.batches = 0
        self.event_counts: Counter[str] = Counter()
        self.processes: dict[int, ev.Resource] = {}
        self.first_ns: int | None = None  # Unix ns of the earliest/latest GPU or API time seen
        self.last_ns: int | None = None
        # Every event's key: its API name, or its family's FamilyKey (``apis`` codes its rows with it).
        self.keys = KeyIndex()
        self.kernels = Groups()  # by kernel name
        self.copies: dict[tuple[str, str], list[int]] = {}  # (op, detail) -> [count, bytes, ns]
        self.apis = Groups(self.keys)  # by API name (each name belongs to one domain)
        self.nvtx: dict[tuple[str, str], list[int]] = {}
        self.streams: dict[tuple[int, int, int], list[int]] = {}  # (pid, dev, stream) -> [ops, busy, lo, hi]
        self.devices: dict[tuple[int, int], IntervalUnion] = {}
        self.stall_functions: dict[str, Counter[str]] = {}
        self.samples: dict[str, int] = {}  # function -> samples
        self.sass: dict[tuple[str, str], int] = {}  # (function, metric) -> sum
        self.losses: dict[tuple[str, str, str], list[int]] = {}  # (stage, reason, unit) -> [events, count]
        self.errors: Counter[tuple[str, str, str]] = Counter()
        # tool -> [spans, ns, not recorded, still on standby]: CUPTI left to another tool (coexistence.md)
        self.yields: dict[str, list[Any]] = {}
        self.stats = StatisticsTotals()  # the collector's ActivityStats and GpuStats
        self.hardware = HardwareTotals()  # PM sampling's counters (PmStats, PmSamples)
        self.kernel_hardware = KernelHardwareTotals()  # ... attributed to kernels (PmKernelStats)
        self.kernel_metrics = KernelMetricsTotals()  # the range profiler's, on demand (KernelMetrics)

    # --- the report -----------------------------------------------------------------------------

    def report(self, top: int | None = 20) -> Report:
        span = (self.last_ns - self.first_ns) if self.first_ns is not None and self.last_ns else 0
        meta: dict[str, Any] = {
            "batches": self.batches,
            "events": dict(sorted(self.event_counts.items())),
            "first_unix_ns": self.first_ns,
            "last_unix_ns": self.last_ns,
            "span_ns": span,
            "processes": [
                {"pid": r.pid, "rank": r.rank, "host": r.host, "process_name": r.process_name}
                for r in self.processes.values()
            ],
        }
        report = Report(meta)
        kernels = self._kernels_shown()
        gpu_total = sum(s[1] for s in kernels.values())
        report.tables.append(cut(Table(
            "kernels", "Kernels by total GPU time",
            ["name", "count", "total_ns", "mean_ns", "min_ns", "max_ns", "share"],
            [[name, c, t, t // c, lo, hi, t / gpu_total if gpu_total else 0.0]
             for name, (c, t, lo, hi) in sorted(kernels.items(), key=lambda kv: -kv[1][1])],
        ), top))  # fmt: skip
        report.tables.append(cut(Table(
            "memory", "Memory copies and sets by kind",
            ["operation", "kind", "count", "bytes", "total_ns", "gb_per_s"],
            [[op, kind, c, b, t, b / t if t else 0.0]
             for (op, kind), (c, b, t) in sorted(self.copies.items(), key=lambda kv: -kv[1][2])],
        ), top))  # fmt: skip
        apis = {(api_domain(n), n): v for n, v in self.apis.items()}
        for name, title, table in (("api", "API calls by total time", apis),
                                   ("nvtx", "NVTX ranges by total time", self.nvtx)):  # fmt: skip
            report.tables.append(cut(Table(
                name, title, ["domain", "name", "count", "total_ns", "mean_ns", "min_ns", "max_ns"],
                [[dom, n, c, t, t // c, lo, hi]
                 for (dom, n), (c, t, lo, hi) in sorted(table.items(), key=lambda kv: -kv[1][1])],
            ), top))  # fmt: skip
        report.tables.append(self._device_table())
        report.tables.append(self._stream_table())
        raw_gpu = any(self.event_counts[tag] for tag in ("kernel", "memcpy", "memset"))
        if self.stats and not raw_gpu:  # no raw records: the GPU tables from the statistics
            meta["gpu_tables_from"] = "statistics"
            shown = {
                name: cut(Table(name, title, columns, rows), top if name != "gpu_busy" else None)
                for name, title, columns, rows in self.stats.tables(self.display, self._label)
            }
            report.tables = [shown.get(t.name, t) for t in report.tables]
        report.tables.append(Table("hw_utilization", HARDWARE_TITLE, HARDWARE_COLUMNS, self.hardware.rows()))
        rows, total = self.kernel_hardware.rows(self.display, top)
        report.tables.append(Table(KERNEL_HARDWARE, KERNEL_HARDWARE_TITLE, KERNEL_HARDWARE_COLUMNS, rows,
                                   total, KERNEL_HARDWARE_HIDDEN))  # fmt: skip
        rows, total = self.kernel_metrics.rows(self.display, top)
        report.tables.append(Table(KERNEL_METRICS, KERNEL_METRICS_TITLE, KERNEL_METRICS_COLUMNS, rows, total))
        report.tables.extend(self._sampling_tables(top))
        report.tables.append(Table(
            "losses", "Losses", ["stage", "reason", "unit", "events", "count"],
            [[st, rs, u, e, c] for (st, rs, u), (e, c) in sorted(self.losses.items())],
        ))  # fmt: skip
        report.tables.append(Table(
            "cupti_yields", "CUPTI left to other tools (not recorded meanwhile)",
            ["tool", "spans", "total_ns", "not_recorded", "standby_after"],
            [[tool, n, t, ",".join(sorted(missed)), ",".join(sorted(standby))]
             for tool, (n, t, missed, standby) in sorted(self.yields.items())],
        ))  # fmt: skip
        report.tables.append(Table(
            "errors", "Errors", ["severity", "origin", "message", "count"],
            [[sv, o, m, c] for (sv, o, m), c in sorted(self.errors.items(), key=lambda kv: -kv[1])],
        ))  # fmt: skip
        return report

    def _kernels_shown(self) -> dict[str, list[int]]:
        """The kernel rows by shown name (two recorded names that demangle alike become one row)."""
        shown: dict[str, list[int]] = {}
        for name, (c, t, lo, hi) in self.kernels.items():
            row = shown.get(key := self.display(name))
            if row is None:
                shown[key] = [c, t, lo, hi]
            else:
                row[0] += c
                row[1] += t
                row[2] = min(row[2], lo)
                row[3] = max(row[3], hi)
        return shown

    def label(self, pid: int) -> str:
        """How tables and figures name a process: its rank when it has one."""
        return self._label(pid)

    def _label(self, pid: int) -> str:
        resource = self.processes.get(pid)
        return f"rank {resource.rank}" if resource is not None and resource.rank is not None else f"pid {pid}"

    def _device_table(self) -> Table:
        rows = []
        for (pid, device), union in sorted(self.devices.items()):
            lo, hi = self.device_span_of(pid, device)
            span = hi - lo
            busy = union.total_ns
            rows.append(
                [pid, self._label(pid), device, busy, max(span - busy, 0), span, busy / span if span else 0.0]
            )
        return Table(
            "gpu_busy",
            "GPU busy per device (kernels, copies, memsets)",
            ["pid", "process", "device", "busy_ns", "idle_ns", "span_ns", "busy_share"],
            rows,
        )

    def device_span_of(self, pid: int, device: int) -> tuple[int, int]:
        spans = [(s[2], s[3]) for (p, d, _), s in self.streams.items() if p == pid and d == device]
        return min(lo for lo, _ in spans), max(hi for _, hi in spans)

    def _stream_table(self) -> Table:
        rows = []
        for (pid, device, stream), (count, busy, _lo, _hi) in sorted(self.streams.items()):
            lo, hi = self.device_span_of(pid, device)
            rows.append(
                [pid, self._label(pid), device, stream, count, busy, busy / (hi - lo) if hi > lo else 0.0]
            )
        return Table(
            "stream_busy",
            "GPU busy per stream (share of the device's span)",
            ["pid", "process", "device", "stream", "operations", "busy_ns", "busy_share"],
            rows,
        )

    def _sampling_tables(self, top: int | None) -> list[Table]:
        total = sum(self.samples.values())
        rows = []
        for name, samples in sorted(self.samples.items(), key=lambda kv: -kv[1]):
            stalls = self.stall_functions[name].most_common(3)
            rows.append([self.display(name), samples, samples / total if total else 0.0] + [
                f"{stall_name(r)} {n / samples:.0%}" if samples else "" for r, n in stalls
            ] + [""] * (3 - len(stalls)))  # fmt: skip
        reasons: Counter[str] = Counter()
        for function_stalls in self.stall_functions.values():
            reasons.update(function_stalls)
        return [
            cut(Table("pc_functions", "PC sampling: functions by samples, with their top stall reasons",
                       ["function", "samples", "share", "stall_1", "stall_2", "stall_3"], rows), top),
            cut(Table("stall_reasons", "PC sampling: stall reasons over all functions",
                       ["reason", "samples", "share"],
                       [[stall_name(r), n, n / total if total else 0.0] for r, n in reasons.most_common()]),
                 top),
            cut(Table("sass", "SASS metrics: totals per function",
                       ["function", "metric", "total"],
                       [[self.display(f), m, v]
                        for (f, m), v in sorted(self.sass.items(), key=lambda kv: -kv[1])]),
                 top),
        ]  # fmt: skip


def cut(table: Table, top: int | None) -> Table:
    table.total_rows = len(table.rows)
    if top is not None:
        table.rows = table.rows[:top]
    return table
