"""Per interval, device and name totals of one decode stream, from whole record arrays.

``add`` folds one gathered array of kernel, memcpy or memset records (the decoder's numpy
structured arrays) with a handful of numpy passes: interval and group ids, ``bincount`` for counts,
sums and histogram buckets. Python runs once per distinct (interval, device, name) of an array,
never per record. Each distinct name pointer is resolved once per stream.

An interval is closed (its events returned) once the stream's newest time is ``LATENESS_NS`` past
its end, and every open one at ``close``. Records of an interval already closed are not in the
statistics: they are counted in ``late_records``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuptistream.cupti.activity_enums import COPY_KINDS, MEMORY_KINDS, enum_name
from cuptistream.events import ActivityStats, Event, GpuStats, PmSamples
from cuptistream.statistics.busy import DeviceBusy
from cuptistream.statistics.coverage import CATEGORIES, Coverage, categories_of
from cuptistream.statistics.histogram import DENSE, slots, to_histogram
from cuptistream.statistics.launch_rate import LaunchRate
from cuptistream.statistics.pm_attribution import PmAttribution
from cuptistream.statistics.stack_fold import StackFold

# The probe hands buffers over every ``activity.flush_interval`` (1 s by default), and a buffer can
# hold records that ended up to about that long before it; 3 s of lateness lets a later buffer's
# records still land in their interval. Statistics of an interval come out this long after its end.
LATENESS_NS = 3_000_000_000
OTHER = "other"
# Names a table keeps while accumulating: the top max_names by time win at close; past this bound
# (a program with endless distinct names) new ones go to ``other`` as they come. 1024 rows of
# histogram are 2 MiB per interval and device.
_SPARE, _SPARE_LEAST = 4, 1024
_I64_MAX = np.iinfo(np.int64).max
_MAX_POINTERS = 1 << 16  # distinct name pointers a stream keeps codes for


class _Table:
    """Totals per name of one interval, device and category, in growing arrays (one row a name)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # names beyond it go to ``other`` as they come
        self.rows: dict[str, int] = {}
        self.count = np.zeros(0, np.int64)
        self.total = np.zeros(0, np.int64)
        self.nbytes = np.zeros(0, np.int64)
        self.low = np.zeros(0, np.int64)
        self.high = np.zeros(0, np.int64)
        self.hist = np.zeros((0, DENSE), np.int64)

    def row(self, name: str) -> int:
        row = self.rows.get(name)
        if row is None:
            # NCCL names keep rows of their own (a few dozen exist): NCCL time stays NCCL time.
            if len(self.rows) >= self.limit and name != OTHER and not _is_nccl(name):
                return self.row(OTHER)
            row = self.rows[name] = len(self.rows)
            if row >= len(self.count):
                grow = max(8, row)
                self.count, self.total, self.nbytes, self.high = (
                    np.concatenate([a, np.zeros(grow, np.int64)])
                    for a in (self.count, self.total, self.nbytes, self.high)
                )
                self.low = np.concatenate([self.low, np.full(grow, _I64_MAX, np.int64)])
                self.hist = np.concatenate([self.hist, np.zeros((grow, DENSE), np.int64)])
        return row


class Accumulator:
    """The statistics of one decode stream. Not thread-safe (the stream's connection thread).

    ``names`` resolves a kernel name pointer (the decoder's ``Names``); it is called once per
    distinct pointer. ``max_names`` caps the kernel names per interval and device (the top ones by
    total time; the rest are one ``other`` row). ``stacks``: the GPU work is also folded per
    launching stack (``StackFold``), its intervals closed and scaled with these. Once the stream
    is handed PM samples (``pm_samples``), its kernels are also attributed the hardware counters
    of the samples they ran in (``PmAttribution``).
    """

    def __init__(
        self, interval_ns: int, max_names: int, names: Callable[[int], str], lateness_ns: int = LATENESS_NS,
        stacks: StackFold | None = None,
    ) -> None:  # fmt: skip
        self.stacks = stacks
        self.pm: PmAttribution | None = None  # from the first PM samples on
        self.interval_ns = interval_ns
        self.max_names = max_names
        self.lateness_ns = lateness_ns
        self.coverage = Coverage()
        self.launches = LaunchRate()
        self.late_records = 0  # ended in an interval already emitted
        self.invalid_records = 0  # no timestamps, or ending before they started
        self.untraced_records = 0  # in an interval whose category was not traced at all
        self.ended_at_close = 0  # kernels in flight when their window closed, ended at the close
        self._kernels_end_by = 0  # a closing window's end (CUPTI ns); 0: none closing
        self._names = names
        self._resolved: dict[int, str] = {}
        self._pointers = np.zeros(0, np.uint64)  # every kernel name pointer seen, sorted
        self._labels: list[str] = []  # their names
        self._tables: dict[tuple[int, int, str], _Table] = {}  # (interval, device, category)
        self._busy: dict[int, DeviceBusy] = {}
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # this buffer's segments
        self._closed_until: int | None = None  # the first interval not yet closed

    # --- records --------------------------------------------------------------------------------

    def add(self, category: str, records: np.ndarray) -> None:
        """Fold one array of ``kernel``, ``memcpy`` or ``memset`` records (other categories are
        ignored). Raises nothing for odd values: records without valid times are counted."""
        if category not in CATEGORIES or not len(records):
            return
        start = records["start"].astype(np.int64)
        end = records["end"].astype(np.int64)
        if category == "kernel":
            if self._kernels_end_by:
                end = self._end_at_close(start, end, self._kernels_end_by)
            end = self._end_in_window(start, end)
        valid = (start > 0) & (end >= start)
        keep = valid
        interval = end // self.interval_ns
        if self._closed_until is not None:
            keep = valid & (interval >= self._closed_until)
            self.late_records += int(np.count_nonzero(valid & ~keep))
        self.invalid_records += len(records) - int(np.count_nonzero(valid))
        if not keep.all():
            if not keep.any():
                return
            records, start, end, interval = records[keep], start[keep], end[keep], interval[keep]
        duration = end - start
        device = records["device_id"].astype(np.int64)
        self.coverage.saw(int(start.min()), int(end.max()))
        if "correlation_id" in (records.dtype.names or ()):
            self.launches.add(start, records["correlation_id"].astype(np.int64))
        self._pending.append((start, end, device))
        if self.stacks is not None and "correlation_id" in (records.dtype.names or ()):
            self.stacks.work(interval, device, records["correlation_id"].astype(np.int64), duration)
        nbytes = None
        if category == "kernel":
            codes, labels = self._kernel_codes(records["name"].astype(np.uint64))
            if self.pm is not None:
                self.pm.kernels(interval, device, start, end, codes, labels)
        else:
            codes = records["copy_kind" if category == "memcpy" else "memory_kind"].astype(np.int64)
            table = COPY_KINDS if category == "memcpy" else MEMORY_KINDS
            labels = [enum_name(table, v) for v in range(int(codes.max()) + 1)]
            nbytes = records["bytes"].astype(np.int64)
        self._fold(category, interval, device, codes.astype(np.int64), labels, duration, nbytes)

    def pm_samples(self, samples: PmSamples) -> None:
        """PM samples of a device this stream's kernels may have run on (any probe's sampler)."""
        if self.pm is None:
            self.pm = PmAttribution(self.interval_ns, self.max_names)
        self.pm.samples(samples)

    def window_closing(self, end: int) -> None:
        """A window's kinds went off at ``end``; its last records come with the forced flush that
        follows. Kernels still running then get the flush's time as their end (CUPTI 13.0: a CUDA
        graph's kernels, ~0.1 s late), so until the window's close they end at ``end`` at the latest:
        the statistics count their time inside the window, which is what the coverage says."""
        self._kernels_end_by = end

    def _end_at_close(self, start: np.ndarray, end: np.ndarray, close: int) -> np.ndarray:
        in_flight = (start > 0) & (start < close) & (end > close)
        if not in_flight.any():
            return end
        self.ended_at_close += int(np.count_nonzero(in_flight))
        return np.where(in_flight, close, end)

    def _end_in_window(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Kernels that started in a window already closed end at its close at the latest, as those
        of the closing flush do (``window_closing``): a CUDA graph's kernels can come back in a later
        buffer, after the close, dated at a later flush."""
        closes = self.coverage.closed_ends("kernel", start)
        if closes is None:
            return end
        late = (closes > 0) & (end > closes)
        if not late.any():
            return end
        self.ended_at_close += int(np.count_nonzero(late))
        return np.where(late, closes, end)

    def _kernel_codes(self, pointers: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Each record's name pointer as an index into the stream's sorted known pointers, and
        their names. A binary search per record: much cheaper than hashing or sorting the array."""
        known = self._pointers
        if len(known):
            codes = np.minimum(np.searchsorted(known, pointers), len(known) - 1)
            fresh = known[codes] != pointers
        else:
            fresh = np.ones(len(pointers), dtype=bool)
        if fresh.any():
            if len(known) > _MAX_POINTERS:  # a program that keeps making names: group this array alone
                unique, codes = np.unique(pointers, return_inverse=True)
                return codes, [self._name(p) for p in unique.tolist()]
            self._pointers = known = np.union1d(known, pointers[fresh])
            self._labels = [self._name(p) for p in known.tolist()]
            codes = np.searchsorted(known, pointers)
        return codes, self._labels

    def _name(self, pointer: int) -> str:
        name = self._resolved.get(pointer)
        if name is None:
            name = self._resolved[pointer] = self._names(pointer)
        return name

    def _fold(
        self, category: str, interval: np.ndarray, device: np.ndarray, codes: np.ndarray,
        labels: list[str], duration: np.ndarray, nbytes: np.ndarray | None,
    ) -> None:  # fmt: skip
        first = int(interval.min())
        spans = int(interval.max()) - first + 1
        if device.min() == device.max():
            devices, dcode = device[:1], np.zeros(len(device), np.int64)
        else:
            devices, dcode = np.unique(device, return_inverse=True)
        nd, nk = len(devices), len(labels)
        group = ((interval - first) * nd + dcode) * nk + codes
        size = spans * nd * nk
        if size <= max(4 * len(group), 1 << 16):
            count = np.bincount(group, minlength=size)
            present = np.flatnonzero(count)
            remap = np.zeros(size, np.int64)
            remap[present] = np.arange(len(present))
            compact, count = remap[group], count[present]
        else:  # records spread over many intervals: group by sorting instead
            present, compact = np.unique(group, return_inverse=True)
            count = np.bincount(compact)
        ng = len(present)
        total = np.rint(np.bincount(compact, weights=duration, minlength=ng)).astype(np.int64)
        moved = (
            np.rint(np.bincount(compact, weights=nbytes, minlength=ng)).astype(np.int64)
            if nbytes is not None
            else np.zeros(ng, np.int64)
        )
        low = np.full(ng, _I64_MAX, np.int64)
        np.minimum.at(low, compact, duration)
        high = np.zeros(ng, np.int64)
        np.maximum.at(high, compact, duration)
        hist = np.bincount(compact * DENSE + slots(duration), minlength=ng * DENSE).reshape(ng, DENSE)
        code = present % nk
        place = present // nk  # (interval - first) * nd + device code: one table each, usually one
        for where in np.unique(place).tolist():
            groups = np.flatnonzero(place == where)
            key = (where // nd + first, int(devices[where % nd]), category)
            table = self._tables.get(key)
            if table is None:
                table = self._tables[key] = _Table(max(self.max_names * _SPARE, _SPARE_LEAST))
            # Python once per distinct name; rows repeat where names fold into ``other``.
            rows = np.array([table.row(labels[k]) for k in code[groups].tolist()], np.int64)
            if len(np.unique(rows)) == len(rows):  # the usual case: plain fancy indexing
                table.count[rows] += count[groups]
                table.total[rows] += total[groups]
                table.nbytes[rows] += moved[groups]
                table.low[rows] = np.minimum(table.low[rows], low[groups])
                table.high[rows] = np.maximum(table.high[rows], high[groups])
                table.hist[rows] += hist[groups]
            else:
                np.add.at(table.count, rows, count[groups])
                np.add.at(table.total, rows, total[groups])
                np.add.at(table.nbytes, rows, moved[groups])
                np.minimum.at(table.low, rows, low[groups])
                np.maximum.at(table.high, rows, high[groups])
                np.add.at(table.hist, rows, hist[groups])

    # --- time -----------------------------------------------------------------------------------

    def buffer_done(self) -> list[Event]:
        """After each buffer: merge its busy segments, and the events of the intervals it closed."""
        if self._pending:
            start, end, device = (np.concatenate(c) for c in zip(*self._pending, strict=True))
            self._pending.clear()
            one = device.min() == device.max()  # the usual case: a process on one GPU
            for dev in [int(device[0])] if one else np.unique(device).tolist():
                mask = slice(None) if one else device == dev
                busy = self._busy.get(dev)
                if busy is None:
                    busy = self._busy[dev] = DeviceBusy(self.interval_ns)
                busy.add(start[mask], end[mask])
                busy.settle(self.coverage.newest - self.lateness_ns)
        return self._close(self.coverage.newest - self.lateness_ns)

    def span(self, window: int, start: int, end: int, kinds: list[str], fresh: bool = False) -> list[Event]:
        """A ``TraceSpan`` of the stream: coverage, and time moving on."""
        self._kernels_end_by = 0  # a window opened, or the closing one closed: its flush is over
        self.coverage.span(window, start, end, kinds)
        if categories_of(kinds):  # budget mode's presence span traces nothing
            self.launches.span(window, start, end, fresh)
        return self._close(self.coverage.newest - self.lateness_ns)

    def close(self) -> list[Event]:
        """The stream ended: every open interval's events."""
        return self._close(None)

    def _close(self, before: int | None) -> list[Event]:
        """Close the intervals that end before ``before`` (None: all)."""
        opened = [k[0] for k in self._tables]
        if self.coverage.began is not None:
            opened.append(self.coverage.began // self.interval_ns)
        if not opened:
            return []
        step = self.interval_ns
        begin = self._closed_until if self._closed_until is not None else min(opened)
        newest = max(self.coverage.newest // step, max(opened))
        limit = newest + 1 if before is None else min(before // step, newest + 1)
        if limit <= begin:
            return []
        if limit - begin > 100_000:  # a clock jump: only the intervals that hold records
            candidates = sorted({k for k in opened if begin <= k < limit})
        else:
            candidates = list(range(begin, limit))
        events: list[Event] = []
        for interval in candidates:
            events.extend(self._emit(interval))
        self._closed_until = limit
        self.coverage.forget_before(limit * step)
        if self.stacks is not None:
            self.stacks.closed_until(limit * step, windowed=self.coverage.spans is not None)
        if self.pm is not None:
            self.pm.closed_until(limit * step)
        return events

    # --- events ---------------------------------------------------------------------------------

    def _emit(self, interval: int) -> list[Event]:
        step = self.interval_ns
        low, high = interval * step, (interval + 1) * step
        for device_busy in self._busy.values():
            device_busy.settle(high)
        traced = {c: self.coverage.traced(c, low, high) for c in CATEGORIES}
        observed = max(self.coverage.observed(low, high), *traced.values())
        events: list[Event] = []
        gpu: dict[int, dict[str, int]] = {}
        kernel_ns: dict[int, dict[str, int]] = {}  # per device and name, for the PM attribution
        for (iv, dev, category), table in sorted(
            ((k, t) for k, t in self._tables.items() if k[0] == interval), key=lambda kt: kt[0]
        ):
            del self._tables[(iv, dev, category)]
            n = len(table.rows)
            if not traced[category]:
                self.untraced_records += int(table.count[:n].sum())
                continue
            sums = gpu.setdefault(dev, {})
            sums[category + "_n"] = int(table.count[:n].sum())
            sums[category + "_ns"] = int(table.total[:n].sum())
            sums[category + "_bytes"] = int(table.nbytes[:n].sum())
            if category == "kernel":
                sums["nccl_ns"] = sum(int(table.total[r]) for name, r in table.rows.items() if _is_nccl(name))
                if self.pm is not None:
                    kernel_ns[dev] = {name: int(table.total[r]) for name, r in table.rows.items()}
            events.extend(self._rows(table, category, low, high, dev, traced[category], observed))
        busy = {dev: b.take(interval) for dev, b in self._busy.items()}
        kernel_traced = traced["kernel"]
        if self.stacks is not None:
            # As the kernel category's ActivityStats: the same traced time and scales.
            scales = self._scales(low, high, kernel_traced, observed) if kernel_traced else None
            events.extend(self.stacks.emit(interval, low, high, kernel_traced, scales))
        if self.pm is not None and kernel_traced:
            events.extend(self.pm.emit(interval, low, high, kernel_ns, self._kernel_traced, kernel_traced))
        if kernel_traced:
            for dev in sorted(busy):
                s = gpu.get(dev, {})
                busy_ns = min(busy[dev], kernel_traced)
                events.append(GpuStats(
                    interval_start=low, interval_end=high, device_id=dev, traced_ns=kernel_traced,
                    traced_fraction=kernel_traced / step, busy_ns=busy_ns,
                    busy_fraction=busy_ns / kernel_traced, kernel_ns=s.get("kernel_ns", 0),
                    nccl_ns=s.get("nccl_ns", 0), copy_ns=s.get("memcpy_ns", 0),
                    memset_ns=s.get("memset_ns", 0), kernels=s.get("kernel_n", 0),
                    copies=s.get("memcpy_n", 0), memsets=s.get("memset_n", 0),
                    copy_bytes=s.get("memcpy_bytes", 0), estimated=kernel_traced < observed,
                ))  # fmt: skip
        return events

    def _kernel_traced(self, low: int, high: int) -> int:
        return self.coverage.traced("kernel", low, high)

    def _rows(
        self, table: _Table, category: str, low: int, high: int, device: int, traced: int, observed: int
    ) -> list[ActivityStats]:
        """One event per name: the top ``max_names`` by total time, the rest as ``other``. Estimates
        scale to ``observed``: the part of the interval the stream was there for, so a program that
        started or ended inside the interval, traced throughout, is measured, not estimated."""
        names = list(table.rows)
        rows = np.array([table.rows[n] for n in names], np.int64)
        order = np.argsort(-table.total[rows], kind="stable")
        kept = [names[i] for i in order.tolist() if names[i] != OTHER][: self.max_names]
        kept += [n for n in names if _is_nccl(n) and n not in set(kept)]  # never folded into ``other``
        folded = [n for n in names if n not in set(kept)]
        out: list[tuple[str, np.ndarray]] = [(n, np.array([table.rows[n]])) for n in kept]
        if folded:
            out.append((OTHER, np.array([table.rows[n] for n in folded])))
        estimated, scale, count_scale = self._scales(low, high, traced, observed)
        events = []
        for name, at in out:
            count, total, nbytes = (int(a[at].sum()) for a in (table.count, table.total, table.nbytes))
            low_ns, high_ns = int(table.low[at].min()), int(table.high[at].max())
            histogram = to_histogram(table.hist[at].sum(axis=0), low_ns, high_ns)
            events.append(ActivityStats(
                interval_start=low, interval_end=high, device_id=device, category=category, name=name,
                count=count, total_ns=total, durations=histogram, traced_ns=traced, estimated=estimated,
                estimated_count=round(count * count_scale), estimated_total_ns=round(total * scale),
                bytes=nbytes, estimated_bytes=round(nbytes * count_scale),
                nccl=category == "kernel" and name != OTHER and _is_nccl(name),
            ))  # fmt: skip
        return events

    def _scales(self, low: int, high: int, traced: int, observed: int) -> tuple[bool, float, float]:
        """Whether ``[low, high)``'s values are estimates, and the scales of times and of counts."""
        # Counts (and bytes, per operation) scale by calls made, not time: the program makes calls
        # faster overall than inside its windows when tracing slows it (``LaunchRate``).
        count_scale = 1.0 if traced >= observed else self.launches.correction(low, high) * observed / traced
        return traced < observed, observed / traced, count_scale


def _is_nccl(name: str) -> bool:
    return name[:4].lower() == "nccl"
