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

import itertools
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuptistream import events as ev
from cuptistream.analysis import records as rec
from cuptistream.analysis.select import Selection

# The families the summary folds; every other family is only counted, by its tag.
API, KERNEL, MEMCPY, MEMSET, NVTX, PC, SASS, LOSS, ERROR, OTHER = range(10)
_FAMILY_ID = {"api": API, "kernel": KERNEL, "memcpy": MEMCPY, "memset": MEMSET, "nvtx_range": NVTX,
              "pc_samples": PC, "sass_metrics": SASS, "loss": LOSS, "error": ERROR}  # fmt: skip
_INTERVALS = frozenset({"api", "kernel", "memcpy", "memset", "nvtx_range"})

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


_key = operator.attrgetter("summary_key")
_name = operator.attrgetter("name")
_start = operator.attrgetter("start")
_end = operator.attrgetter("end")
_device = operator.attrgetter("device_id")
_stream = operator.attrgetter("stream_id")


def _generic_key(event: Any) -> Any:
    """``summary_key`` of an event that is not one of the summary's Structs (Kafka, JSON Lines)."""
    tag = rec.tag_of(event)
    return event.name if tag == "api" else rec.FAMILY_KEY[tag]


def _generic_time(event: Any, field: str) -> int:
    return getattr(event, field) if rec.tag_of(event) in _INTERVALS else 0


_I64 = (-(2**63), 2**63 - 1)


def _within(starts: np.ndarray, low: int, high: int) -> np.ndarray:
    """``low <= starts < high`` for Python-int bounds that may lie outside int64."""
    last = high - 1
    if low > _I64[1] or last < _I64[0] or last < low:
        return np.zeros(len(starts), bool)
    return (starts >= max(low, _I64[0])) & (starts <= min(last, _I64[1]))


def _take(events: Sequence[Any], index: np.ndarray) -> Sequence[Any]:
    """``events`` at ``index`` (sorted positions), with C-level loops only."""
    if len(index) == len(events):
        return events
    if len(index) == 1:
        return [events[int(index[0])]]
    return operator.itemgetter(*index.tolist())(events) if len(index) else ()


class KeyIndex(dict[Any, int]):
    """key -> a small integer, given to each new key in the order keys are first seen."""

    def __init__(self) -> None:
        super().__init__()
        self.keys_: list[Any] = []

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self.keys_)
        self.keys_.append(key)
        return code

    def codes(self, keys: Any, n: int) -> np.ndarray:
        return np.fromiter(map(self.__getitem__, keys), np.intp, n)


class Groups:
    """count, total, min and max of durations per key, folded a batch at a time with numpy.

    Keys are coded by ``index`` (its own, or one shared with other tables: only keys that were
    folded here have rows)."""

    def __init__(self, index: KeyIndex | None = None) -> None:
        self.index = KeyIndex() if index is None else index
        self.stats = np.zeros((4, 0), np.int64)  # rows: count, total, min, max

    def add(self, keys: Sequence[str], durations: np.ndarray) -> None:
        self.add_codes(self.index.codes(keys, len(keys)), durations)

    def add_codes(self, codes: np.ndarray, durations: np.ndarray) -> None:
        width = self.stats.shape[1]
        if len(self.index.keys_) > width:
            grown = np.zeros((4, max(64, 2 * len(self.index.keys_))), np.int64)
            grown[:, :width] = self.stats
            grown[2, width:] = np.iinfo(np.int64).max
            grown[3, width:] = np.iinfo(np.int64).min
            self.stats = grown
        np.add.at(self.stats[0], codes, 1)
        np.add.at(self.stats[1], codes, durations)
        np.minimum.at(self.stats[2], codes, durations)
        np.maximum.at(self.stats[3], codes, durations)

    def items(self) -> list[tuple[Any, list[int]]]:
        keys = self.index.keys_[: self.stats.shape[1]]
        columns = self.stats[:, : len(keys)].T.tolist()
        return [(key, columns[i]) for i, key in enumerate(keys) if columns[i][0]]


class Summarizer:
    """Folds batches (``records.Part``) into the summary's totals."""

    def __init__(self, selection: Selection | None = None) -> None:
        self.selection = selection or Selection()
        self.batches = 0
        self.event_counts: Counter[str] = Counter()
        self.processes: dict[int, ev.Resource] = {}
        self.first_ns: int | None = None  # Unix ns of the earliest/latest GPU or API time seen
        self.last_ns: int | None = None
        # Every event's key: its API name, or its family's FamilyKey; the family of each code.
        self.keys = KeyIndex()
        self.families = np.zeros(0, np.int8)
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

    # --- folding --------------------------------------------------------------------------------

    def add(self, part: rec.Part) -> None:
        sel = self.selection
        resource = part.resource
        if not sel.accepts(resource):
            return
        self.batches += 1
        pid = resource.pid
        self.processes.setdefault(pid, resource)
        events = part.events
        off = part.offset_ns
        low = high = None
        if sel.timed:
            low, high = sel.window(off, events)
        n = len(events)
        if not n:
            return
        codes, starts, ends = self._columns(events)
        family = self.families[codes]
        present = np.bincount(family, minlength=OTHER + 1).tolist()
        inside = None if low is None else _within(starts, low - off, high - off)  # type: ignore[operator]
        if present[OTHER]:  # counted by tag, whatever the filters
            counted = np.bincount(codes[family == OTHER])
            keys = self.keys.keys_
            for code in np.flatnonzero(counted).tolist():
                self.event_counts[keys[code].tag] += int(counted[code])
        seen_lo: list[int] = []
        seen_hi: list[int] = []
        for fam in (API, NVTX):
            if not present[fam]:
                continue
            mask = family == fam
            if inside is not None:
                mask &= inside
            index = np.flatnonzero(mask)
            self.event_counts["api" if fam == API else "nvtx_range"] += len(index)
            if not len(index):
                continue
            s, e = starts[index], ends[index]
            seen_lo.append(int(s.min()))
            seen_hi.append(int(e.max()))
            if fam == API:
                self.apis.add_codes(codes[index], e - s)
            else:
                for r in _take(events, index):
                    _fold(self.nvtx, (r.domain, r.name), r.end - r.start)
        if seen_lo:
            self._seen(min(seen_lo) + off, max(seen_hi) + off)
        gpu: list[tuple[np.ndarray, ...]] = []
        devices = sel.devices
        for fam, tag in ((KERNEL, "kernel"), (MEMCPY, "memcpy"), (MEMSET, "memset")):
            if not present[fam]:
                continue
            index = np.flatnonzero(family == fam)
            items = _take(events, index)
            dev = np.fromiter(map(_device, items), np.int64, len(index))
            keep = None
            if devices is not None:
                keep = np.isin(dev, np.fromiter(devices, np.int64, len(devices)))
            if inside is not None:
                keep = inside[index] if keep is None else keep & inside[index]
            if keep is not None and not keep.all():
                items = list(itertools.compress(items, keep.tolist()))
                index, dev = index[keep], dev[keep]
            self.event_counts[tag] += len(index)
            if not len(index):
                continue
            s, e = starts[index], ends[index]
            gpu.append((s, e, dev, np.fromiter(map(_stream, items), np.int64, len(index))))
            if fam == KERNEL:
                self.kernels.add(list(map(_name, items)), e - s)
            elif fam == MEMCPY:
                for c in items:
                    self._copy(("memcpy " + c.copy_kind, f"{c.src_kind} -> {c.dst_kind}"), c)
            else:
                for m in items:
                    self._copy(("memset", m.memory_kind), m)
        if gpu:
            s, e, dev, stream = (np.concatenate(c) if len(gpu) > 1 else c[0] for c in zip(*gpu, strict=True))
            self._busy(pid, s, e, dev, stream, off, high)
        rare = {}
        for fam, tag in ((PC, "pc_samples"), (SASS, "sass_metrics"), (LOSS, "loss"), (ERROR, "error")):
            if present[fam]:
                rare[tag] = _take(events, np.flatnonzero(family == fam))
        if rare:
            self._sampling(rare, devices, off, low, high)
            self._accounting(rare, off, low, high)

    def _columns(self, events: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each event's key code, start and end (0 for families without them)."""
        n = len(events)
        index = self.keys
        try:  # the summary's Structs (records.SUMMARY_TYPES): C-level passes
            codes = index.codes(map(_key, events), n)
            starts = np.fromiter(map(_start, events), np.int64, n)
            ends = np.fromiter(map(_end, events), np.int64, n)
        except AttributeError:  # any other Structs (Kafka, JSON Lines, the light ones)
            codes = index.codes(map(_generic_key, events), n)
            starts = np.fromiter((_generic_time(e, "start") for e in events), np.int64, n)
            ends = np.fromiter((_generic_time(e, "end") for e in events), np.int64, n)
        known = len(self.families)
        if len(index.keys_) > known:
            fresh = [API if isinstance(k, str) else _FAMILY_ID.get(k.tag, OTHER) for k in index.keys_[known:]]
            self.families = np.concatenate([self.families, np.array(fresh, np.int8)])
        return codes, starts, ends

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

    def _busy(
        self, pid: int, starts: np.ndarray, ends: np.ndarray, dev: np.ndarray, stream: np.ndarray, off: int,
        high: int | None,
    ) -> None:  # fmt: skip
        if high is not None:
            ends = np.minimum(ends, max(min(high - off, _I64[1]), _I64[0]))
        self._seen(int(starts.min()) + off, int(ends.max()) + off)
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
