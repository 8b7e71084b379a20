"""``cuptistream summary``: nsys-stats-like tables, computed in one streaming pass.

``Summarizer.add(part)`` folds one batch into running totals keyed by kernel name, copy kind, API
name, NVTX range, stream and so on, then drops the batch; memory grows with the number of distinct
keys, never with the number of events. ``report()`` turns the totals into ``Table``s, which
``cuptistream.analysis.report`` renders as text, CSV or JSON.

Window rule: an event counts when it starts inside ``[since, until)``; busy time is clipped to the
window. Device busy time is the union of the intervals of kernels, copies and memsets on the device
(overlapping streams count once); stream busy time is the sum of its operations' durations.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuptistream import events as ev
from cuptistream.analysis import records as rec
from cuptistream.analysis.select import Selection

# Both the light and the full Structs, so Kafka and JSON Lines (full) go through the same code.
_FAMILY: dict[type, str] = {}
for _light, _full in [
    (rec.LKernel, ev.Kernel), (rec.LMemcpy, ev.Memcpy), (rec.LMemset, ev.Memset), (rec.LApiCall, ev.ApiCall),
    (rec.LNvtxRange, ev.NvtxRange), (rec.LPcSampleBatch, ev.PcSampleBatch),
    (rec.LSassMetricBatch, ev.SassMetricBatch), (rec.LLoss, ev.Loss), (rec.LError, ev.Error),
]:  # fmt: skip
    _FAMILY[_light] = _FAMILY[_full] = str(_light.__struct_config__.tag)
_FAMILY[rec.SKernel] = "kernel"
_FAMILY[rec.SApiCall] = "api"

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

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass
class Report:
    meta: dict[str, Any]
    tables: list[Table] = field(default_factory=list)

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)


class IntervalUnion:
    """The total length of a union of intervals that arrive in batches, in bounded memory.

    The merged intervals are kept sorted; past ``keep`` of them, the oldest half is closed (its
    length banked) and later intervals are clipped to start after it. Exact as long as no interval
    arrives after more than ``keep // 2`` newer disjoint ones, which holds for CUPTI's buffers.
    """

    def __init__(self, keep: int = 8192) -> None:
        self.keep = keep
        self.starts = np.empty(0, np.int64)
        self.ends = np.empty(0, np.int64)
        self.closed_ns = 0
        self.floor: int | None = None

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if self.floor is not None:
            starts = np.maximum(starts, self.floor)
        live = ends > starts
        s = np.concatenate([self.starts, starts[live]])
        e = np.concatenate([self.ends, ends[live]])
        if not len(s):
            return
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        reach = np.maximum.accumulate(e)
        first = np.ones(len(s), bool)
        first[1:] = s[1:] > reach[:-1]
        index = np.flatnonzero(first)
        s, e = s[index], np.maximum.reduceat(e, index)
        if len(s) > self.keep:
            cut = len(s) - self.keep // 2
            self.closed_ns += int((e[:cut] - s[:cut]).sum())
            self.floor = int(e[cut - 1])
            s, e = s[cut:], e[cut:]
        self.starts, self.ends = s, e

    @property
    def total_ns(self) -> int:
        return self.closed_ns + int((self.ends - self.starts).sum())


def _fold(stats: dict[Any, list[int]], key: Any, d: int) -> None:
    s = stats.get(key)
    if s is None:
        stats[key] = [1, d, d, d]
    else:
        s[0] += 1
        s[1] += d
        if d < s[2]:
            s[2] = d
        elif d > s[3]:
            s[3] = d


_name = operator.attrgetter("name")
_start = operator.attrgetter("start")
_end = operator.attrgetter("end")
_device = operator.attrgetter("device_id")
_stream = operator.attrgetter("stream_id")


def _durations(items: Sequence[Any]) -> np.ndarray:
    n = len(items)
    return np.fromiter(map(_end, items), np.int64, n) - np.fromiter(map(_start, items), np.int64, n)


def _partition(events: Sequence[Any]) -> dict[type, Sequence[Any]]:
    """Events grouped by class, with C-level loops only: a batch holds few classes, many events."""
    classes = list(map(type, events))
    kinds = list(dict.fromkeys(classes))
    if len(kinds) == 1:
        return {kinds[0]: events}
    codes = np.fromiter(map({k: i for i, k in enumerate(kinds)}.__getitem__, classes), np.intp, len(classes))
    groups: dict[type, Sequence[Any]] = {}
    for i, kind in enumerate(kinds):
        index = np.flatnonzero(codes == i).tolist()
        groups[kind] = operator.itemgetter(*index)(events) if len(index) > 1 else [events[index[0]]]
    return groups


class Groups:
    """count, total, min and max of durations per key, folded a batch at a time with numpy."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.stats = np.zeros((4, 64), np.int64)  # rows: count, total, min, max

    def add(self, keys: list[str], durations: np.ndarray) -> None:
        new = set(keys).difference(self.index)
        if new:
            for key in new:
                self.index[key] = len(self.index)
            if len(self.index) > self.stats.shape[1]:
                grown = np.zeros((4, 2 * len(self.index)), np.int64)
                grown[:, : self.stats.shape[1]] = self.stats
                self.stats = grown
            fresh = list(self.index.values())[-len(new) :]
            self.stats[2, fresh] = np.iinfo(np.int64).max
            self.stats[3, fresh] = np.iinfo(np.int64).min
        codes = np.fromiter(map(self.index.__getitem__, keys), np.intp, len(keys))
        np.add.at(self.stats[0], codes, 1)
        np.add.at(self.stats[1], codes, durations)
        np.minimum.at(self.stats[2], codes, durations)
        np.maximum.at(self.stats[3], codes, durations)

    def items(self) -> list[tuple[str, list[int]]]:
        columns = self.stats[:, : len(self.index)].T.tolist()
        return [(key, columns[i]) for key, i in self.index.items() if columns[i][0]]


class Summarizer:
    """Folds batches (``records.Part``) into the summary's totals."""

    def __init__(self, selection: Selection | None = None) -> None:
        self.selection = selection or Selection()
        self.batches = 0
        self.event_counts: Counter[str] = Counter()
        self.processes: dict[int, ev.Resource] = {}
        self.first_ns: int | None = None  # Unix ns of the earliest/latest GPU or API time seen
        self.last_ns: int | None = None
        self.kernels = Groups()  # by kernel name
        self.copies: dict[tuple[str, str], list[int]] = {}  # (op, detail) -> [count, bytes, ns]
        self.apis = Groups()  # by API name (each name belongs to one domain)
        self.nvtx: dict[tuple[str, str], list[int]] = {}
        self.streams: dict[tuple[int, int, int], list[int]] = {}  # (pid, dev, stream) -> [ops, busy, lo, hi]
        self.devices: dict[tuple[int, int], IntervalUnion] = {}
        self.stall_functions: dict[str, Counter[str]] = {}
        self.samples: dict[str, int] = {}  # function -> samples
        self.sass: dict[tuple[str, str], int] = {}  # (function, metric) -> sum
        self.losses: dict[tuple[str, str, str], list[int]] = {}  # (stage, reason, unit) -> [events, count]
        self.errors: Counter[tuple[str, str, str]] = Counter()

    # --- folding --------------------------------------------------------------------------------

    def add(self, part: rec.Part) -> None:
        sel = self.selection
        resource = part.resource
        if not sel.accepts(resource):
            return
        self.batches += 1
        pid = resource.pid
        self.processes.setdefault(pid, resource)
        groups = _partition(part.events)
        off = part.offset_ns
        low = high = None
        if sel.timed:
            low, high = sel.window(off, part.events)
        families: dict[str, Sequence[Any]] = {}
        for cls, group in groups.items():
            family = _FAMILY.get(cls)
            if family is None:
                self.event_counts[rec.tag_of(group[0])] += len(group)
                continue
            families[family] = group
        devices = sel.devices
        gpu: list[Any] = []
        for family in ("kernel", "memcpy", "memset"):
            items = families.get(family)
            if not items:
                continue
            if devices is not None:
                items = [e for e in items if e.device_id in devices]
            if low is not None:
                lo, hi = low - off, high - off  # type: ignore[operator]
                items = [e for e in items if lo <= e.start < hi]
            self.event_counts[family] += len(items)
            gpu.extend(items)
            if family == "kernel":
                self.kernels.add(list(map(_name, items)), _durations(items))
            elif family == "memcpy":
                for c in items:
                    self._copy(("memcpy " + c.copy_kind, f"{c.src_kind} -> {c.dst_kind}"), c)
            else:
                for m in items:
                    self._copy(("memset", m.memory_kind), m)
        if gpu:
            self._busy(pid, gpu, off, low, high)
        for family in ("api", "nvtx_range"):
            items = families.get(family)
            if not items:
                continue
            if low is not None:
                lo, hi = low - off, high - off  # type: ignore[operator]
                items = [e for e in items if lo <= e.start < hi]
            self.event_counts[family] += len(items)
            if family == "api":
                self.apis.add(list(map(_name, items)), _durations(items))
            else:
                for n in items:
                    _fold(self.nvtx, (n.domain, n.name), n.end - n.start)
            if items:
                self._seen(min(map(_start, items)) + off, max(map(_end, items)) + off)
        self._sampling(families, devices, off, low, high)
        self._accounting(families, off, low, high)

    def _copy(self, key: tuple[str, str], op: Any) -> None:
        s = self.copies.get(key)
        if s is None:
            self.copies[key] = [1, op.bytes, op.end - op.start]
        else:
            s[0] += 1
            s[1] += op.bytes
            s[2] += op.end - op.start

    def _seen(self, first: int, last: int) -> None:
        if self.first_ns is None or first < self.first_ns:
            self.first_ns = first
        if self.last_ns is None or last > self.last_ns:
            self.last_ns = last

    def _busy(self, pid: int, ops: list[Any], off: int, low: int | None, high: int | None) -> None:
        starts = np.fromiter(map(_start, ops), np.int64, len(ops))
        ends = np.fromiter(map(_end, ops), np.int64, len(ops))
        if low is not None:
            np.clip(ends, None, high - off, out=ends)  # type: ignore[operator]
        self._seen(int(starts.min()) + off, int(ends.max()) + off)
        dev = np.fromiter(map(_device, ops), np.int64, len(ops))
        stream = np.fromiter(map(_stream, ops), np.int64, len(ops))
        # One key per (device, stream): group with numpy instead of a dict update per operation.
        keys = (dev << 32) | stream
        uniq, inverse = np.unique(keys, return_inverse=True)
        lengths = np.maximum(ends - starts, 0)
        busy = np.bincount(inverse, weights=lengths, minlength=len(uniq))
        count = np.bincount(inverse, minlength=len(uniq))
        for i, key in enumerate(uniq.tolist()):
            mask = inverse == i
            ident = (pid, key >> 32, key & 0xFFFFFFFF)
            lo, hi = int(starts[mask].min()) + off, int(ends[mask].max()) + off
            s = self.streams.get(ident)
            if s is None:
                self.streams[ident] = [int(count[i]), int(busy[i]), lo, hi]
            else:
                s[0] += int(count[i])
                s[1] += int(busy[i])
                s[2] = min(s[2], lo)
                s[3] = max(s[3], hi)
        for device in np.unique(dev).tolist():
            mask = dev == device
            union = self.devices.get((pid, device))
            if union is None:
                union = self.devices[(pid, device)] = IntervalUnion()
            union.add(starts[mask] + off, ends[mask] + off)

    def _sampling(
        self, families: dict[str, Sequence[Any]], devices: frozenset[int] | None, off: int,
        low: int | None, high: int | None,
    ) -> None:  # fmt: skip
        for batch in families.get("pc_samples", ()):
            if (devices is not None and batch.device_id not in devices) or not _inside(
                batch.timestamp + off, low, high
            ):
                continue
            self.event_counts["pc_samples"] += 1
            for sample in batch.samples:
                name = sample.function_name
                stalls = self.stall_functions.get(name)
                if stalls is None:
                    stalls = self.stall_functions[name] = Counter()
                total = 0
                for reason, n in sample.stalls.items():
                    if not reason.endswith("_not_issued"):  # a subset of the reason without the suffix
                        stalls[reason] += n
                        total += n
                self.samples[name] = self.samples.get(name, 0) + total
        for batch in families.get("sass_metrics", ()):
            if (devices is not None and batch.device_id not in devices) or not _inside(
                batch.timestamp + off, low, high
            ):
                continue
            self.event_counts["sass_metrics"] += 1
            for record in batch.records:
                for metric, values in record.values.items():
                    key = (record.function_name, metric)
                    self.sass[key] = self.sass.get(key, 0) + sum(values)

    def _accounting(
        self, families: dict[str, Sequence[Any]], off: int, low: int | None, high: int | None
    ) -> None:
        for loss in families.get("loss", ()):
            if low is not None and not (loss.until >= low and loss.since < high):
                continue
            self.event_counts["loss"] += 1
            key = (loss.stage, loss.reason, loss.unit)
            s = self.losses.setdefault(key, [0, 0])
            s[0] += 1
            s[1] += loss.count
        for error in families.get("error", ()):
            if _inside(error.timestamp + off, low, high):
                self.event_counts["error"] += 1
                self.errors[(error.severity, error.origin, error.message)] += 1

    def add_torn_tail(self, path: str, length: int) -> None:
        """A file whose last frame was incomplete: reported with the losses, in bytes."""
        s = self.losses.setdefault(("file:" + path, "torn_tail", "bytes"), [0, 0])
        s[0] += 1
        s[1] += length

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
        gpu_total = sum(s[1] for _, s in self.kernels.items())
        report.tables.append(_cut(Table(
            "kernels", "Kernels by total GPU time",
            ["name", "count", "total_ns", "mean_ns", "min_ns", "max_ns", "share"],
            [[name, c, t, t // c, lo, hi, t / gpu_total if gpu_total else 0.0]
             for name, (c, t, lo, hi) in sorted(self.kernels.items(), key=lambda kv: -kv[1][1])],
        ), top))  # fmt: skip
        report.tables.append(_cut(Table(
            "memory", "Memory copies and sets by kind",
            ["operation", "kind", "count", "bytes", "total_ns", "gb_per_s"],
            [[op, kind, c, b, t, b / t if t else 0.0]
             for (op, kind), (c, b, t) in sorted(self.copies.items(), key=lambda kv: -kv[1][2])],
        ), top))  # fmt: skip
        apis = {(api_domain(n), n): v for n, v in self.apis.items()}
        for name, title, table in (("api", "API calls by total time", apis),
                                   ("nvtx", "NVTX ranges by total time", self.nvtx)):  # fmt: skip
            report.tables.append(_cut(Table(
                name, title, ["domain", "name", "count", "total_ns", "mean_ns", "min_ns", "max_ns"],
                [[dom, n, c, t, t // c, lo, hi]
                 for (dom, n), (c, t, lo, hi) in sorted(table.items(), key=lambda kv: -kv[1][1])],
            ), top))  # fmt: skip
        report.tables.append(self._device_table())
        report.tables.append(self._stream_table())
        report.tables.extend(self._sampling_tables(top))
        report.tables.append(Table(
            "losses", "Losses", ["stage", "reason", "unit", "events", "count"],
            [[st, rs, u, e, c] for (st, rs, u), (e, c) in sorted(self.losses.items())],
        ))  # fmt: skip
        report.tables.append(Table(
            "errors", "Errors", ["severity", "origin", "message", "count"],
            [[sv, o, m, c] for (sv, o, m), c in sorted(self.errors.items(), key=lambda kv: -kv[1])],
        ))  # fmt: skip
        return report

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
            rows.append([name, samples, samples / total if total else 0.0] + [
                f"{stall_name(r)} {n / samples:.0%}" if samples else "" for r, n in stalls
            ] + [""] * (3 - len(stalls)))  # fmt: skip
        reasons: Counter[str] = Counter()
        for function_stalls in self.stall_functions.values():
            reasons.update(function_stalls)
        return [
            _cut(Table("pc_functions", "PC sampling: functions by samples, with their top stall reasons",
                       ["function", "samples", "share", "stall_1", "stall_2", "stall_3"], rows), top),
            _cut(Table("stall_reasons", "PC sampling: stall reasons over all functions",
                       ["reason", "samples", "share"],
                       [[stall_name(r), n, n / total if total else 0.0] for r, n in reasons.most_common()]),
                 top),
            _cut(Table("sass", "SASS metrics: totals per function",
                       ["function", "metric", "total"],
                       [[f, m, v] for (f, m), v in sorted(self.sass.items(), key=lambda kv: -kv[1])]), top),
        ]  # fmt: skip


def _inside(t: int, low: int | None, high: int | None) -> bool:
    return low is None or low <= t < high  # type: ignore[operator]


def _cut(table: Table, top: int | None) -> Table:
    table.total_rows = len(table.rows)
    if top is not None:
        table.rows = table.rows[:top]
    return table


def summarize(recording: rec.Recording, selection: Selection | None = None, top: int | None = 20) -> Report:
    """One pass over ``recording``; the summary of what ``selection`` keeps."""
    summarizer = Summarizer(selection)
    for part in recording.parts():  # Recording(spec, lean=True) decodes only what the summary reads
        summarizer.add(part)
    for tail in recording.torn_tails:
        summarizer.add_torn_tail(tail.path, tail.length)
    return summarizer.report(top)
