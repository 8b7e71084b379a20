"""``cuptistream summary``: nsys-stats-like tables, computed in one streaming pass.

``Summarizer.add(part)`` folds one batch into running totals keyed by kernel name, copy kind, API
name, NVTX range, stream and so on, then drops the batch; memory grows with the number of distinct
keys, never with the number of events. ``report()`` turns the totals into ``Table``s
(``summary_report``: the totals and their tables), which ``cuptistream.analysis.report`` renders as
text, CSV or JSON; the aggregates themselves are ``aggregate``.

Window rule: an event counts when it starts inside ``[since, until)``; busy time is clipped to the
window. Device busy time is the union of the intervals of kernels, copies and memsets on the device
(overlapping streams count once); stream busy time is the sum of its operations' durations.
"""

from __future__ import annotations

import itertools
import operator
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from cuptistream.analysis import records as rec
from cuptistream.analysis.aggregate import I64, IntervalUnion, fold, take, within
from cuptistream.analysis.select import Selection
from cuptistream.analysis.summary_report import Report, Table, Totals

# ``Report`` and ``Table`` are what ``summarize`` returns: importable from here, as before the split.
__all__ = ["Report", "Summarizer", "Table", "summarize"]

# The families the summary folds; every other family is only counted, by its tag.
API, KERNEL, MEMCPY, MEMSET, NVTX, PC, SASS, LOSS, ERROR, YIELD, OTHER, ASTATS, GSTATS, PMS, PMST, PMK, KM = (
    range(17)
)
_FAMILY_ID = {"api": API, "kernel": KERNEL, "memcpy": MEMCPY, "memset": MEMSET, "nvtx_range": NVTX,
              "pc_samples": PC, "sass_metrics": SASS, "loss": LOSS, "error": ERROR,
              "cupti_yield": YIELD, "activity_stats": ASTATS, "gpu_stats": GSTATS, "pm_samples": PMS,
              "pm_stats": PMST, "pm_kernel_stats": PMK, "kernel_metrics": KM}  # fmt: skip
_FAMILIES = len(_FAMILY_ID) + 1  # with OTHER
_INTERVALS = frozenset({"api", "kernel", "memcpy", "memset", "nvtx_range"})

_key = operator.attrgetter("summary_key")
_name = operator.attrgetter("name")
_start = operator.attrgetter("start")
_end = operator.attrgetter("end")
_device = operator.attrgetter("device_id")
_stream = operator.attrgetter("stream_id")
_carried = operator.attrgetter("demangled_name")


def _generic_key(event: Any) -> Any:
    """``summary_key`` of an event that is not one of the summary's Structs (Kafka, JSON Lines)."""
    tag = rec.tag_of(event)
    return event.name if tag == "api" else rec.FAMILY_KEY[tag]


def _generic_time(event: Any, field: str) -> int:
    return getattr(event, field) if rec.tag_of(event) in _INTERVALS else 0


class Summarizer(Totals):
    """Folds batches (``records.Part``) into the summary's totals."""

    def __init__(self, selection: Selection | None = None, *, mangled: bool = False) -> None:
        super().__init__(mangled=mangled)
        self.selection = selection or Selection()
        self.families = np.zeros(0, np.int8)

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
        present = np.bincount(family, minlength=_FAMILIES).tolist()
        inside = None if low is None else within(starts, low - off, high - off)  # type: ignore[operator]
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
                for r in take(events, index):
                    fold(self.nvtx, (r.domain, r.name), r.end - r.start)
        if seen_lo:
            self._seen(min(seen_lo) + off, max(seen_hi) + off)
        gpu: list[tuple[np.ndarray, ...]] = []
        devices = sel.devices
        for fam, tag in ((KERNEL, "kernel"), (MEMCPY, "memcpy"), (MEMSET, "memset")):
            if not present[fam]:
                continue
            index = np.flatnonzero(family == fam)
            items = take(events, index)
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
                if any(map(_carried, items)):  # recorded with demangle: true
                    self.display.learn(items)
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
        for fam, tag in ((PC, "pc_samples"), (SASS, "sass_metrics"), (LOSS, "loss"), (ERROR, "error"),
                         (YIELD, "cupti_yield"), (ASTATS, "activity_stats"),
                         (GSTATS, "gpu_stats"), (PMS, "pm_samples"), (PMST, "pm_stats"),
                         (PMK, "pm_kernel_stats"), (KM, "kernel_metrics")):  # fmt: skip
            if present[fam]:
                rare[tag] = take(events, np.flatnonzero(family == fam))
        if rare:
            self._sampling(rare, devices, off, low, high)
            self._accounting(rare, off, low, high)
            self._statistics(pid, rare, devices, off, low, high)
            self._hardware(resource.host, rare, devices, off, low, high)

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
            ends = np.minimum(ends, max(min(high - off, I64[1]), I64[0]))
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
        for span in families.get("cupti_yield", ()):
            if _inside(span.start + off, low, high):
                self.event_counts["cupti_yield"] += 1
                row = self.yields.setdefault(span.tool, [0, 0, set(), set()])
                row[0] += 1
                row[1] += span.end - span.start
                row[2].update(span.missed)
                row[3].update(span.standby)

    def _statistics(
        self, pid: int, families: dict[str, Sequence[Any]], devices: frozenset[int] | None, off: int,
        low: int | None, high: int | None,
    ) -> None:  # fmt: skip
        """The collector's statistics (``ActivityStats``, ``GpuStats``): an interval counts when it
        starts inside the window. Shown only where the recording holds no raw GPU records."""
        for tag in ("activity_stats", "gpu_stats"):
            for st in families.get(tag, ()):
                if (devices is not None and st.device_id not in devices) or not _inside(
                    st.interval_start + off, low, high
                ):
                    continue
                self.event_counts[tag] += 1
                self._seen(st.interval_start + off, st.interval_end + off)
                if tag == "gpu_stats":
                    self.stats.device(pid, st)
                else:
                    self.stats.activity(st)

    def _hardware(
        self, host: str, families: dict[str, Sequence[Any]], devices: frozenset[int] | None, off: int,
        low: int | None, high: int | None,
    ) -> None:  # fmt: skip
        """PM sampling's counters (``summary_hardware``), their attribution to kernels
        (``summary_kernel_hardware``) and the range profiler's (``summary_kernel_metrics``): an
        interval, a sample or a window counts when it starts inside the summary's window."""
        for st in families.get("pm_stats", ()):
            if (devices is None or st.device_id in devices) and _inside(st.interval_start + off, low, high):
                self.event_counts["pm_stats"] += 1
                self.hardware.add_stats(host, st)
        for st in families.get("pm_kernel_stats", ()):
            if (devices is None or st.device_id in devices) and _inside(st.interval_start + off, low, high):
                self.event_counts["pm_kernel_stats"] += 1
                self.kernel_hardware.add(host, st)
        for event in families.get("kernel_metrics", ()):  # on-demand windows' range profiling
            if (devices is None or event.device_id in devices) and _inside(event.start + off, low, high):
                self.event_counts["kernel_metrics"] += 1
                self.kernel_metrics.add(host, event)
        for samples in families.get("pm_samples", ()):
            if devices is not None and samples.device_id not in devices:
                continue
            self.event_counts["pm_samples"] += 1
            keep = None if low is None else [_inside(s + off, low, high) for s in samples.starts]
            for problem in self.hardware.add_samples(host, samples, keep):
                self.errors[("warning", "summary", problem)] += 1

    def add_torn_tail(self, path: str, length: int) -> None:
        """A file whose last frame was incomplete: reported with the losses, in bytes."""
        s = self.losses.setdefault(("file:" + path, "torn_tail", "bytes"), [0, 0])
        s[0] += 1
        s[1] += length


def _inside(t: int, low: int | None, high: int | None) -> bool:
    return low is None or low <= t < high  # type: ignore[operator]


def summarize(
    recording: rec.Recording, selection: Selection | None = None, top: int | None = 20, *,
    mangled: bool = False,
) -> Report:  # fmt: skip
    """One pass over ``recording``; the summary of what ``selection`` keeps (names demangled unless
    ``mangled``, see ``names``)."""
    summarizer = Summarizer(selection, mangled=mangled)
    for part in recording.parts():  # Recording(spec, lean=True) decodes only what the summary reads
        summarizer.add(part)
    for tail in recording.torn_tails:
        summarizer.add_torn_tail(tail.path, tail.length)
    return summarizer.report(top)
