"""Hardware counters attributed to the kernels that ran during the samples (``PmKernelStats``).

Where the join happens. Samples are per device and come from one probe (the sampler); kernels come
from every process on the device, each decoded by its own stream, possibly in a decode worker. The
samples are the small side (50 a second per device at the default 20 ms, against up to a million
kernels a second), so they travel: the collector hands every ``PmSamples`` event to every decode
stream it serves (``collector.pm_samples``), and each stream's statistics join them with its own
kernels here, where the records already are as numpy arrays. No kernel record crosses a process or
thread, and a stream whose collector sees no samples for a device folds nothing for it.

The fold. Each array of kernels the accumulator keeps is put onto the device's sample grid with a
few numpy passes: two binary searches give the samples a kernel overlaps (usually one; a kernel
straddling sample boundaries is split), and ``bincount`` sums the overlap per (interval, sample,
name). A kernel that ended after the newest sample waits (start, end, name: 24 bytes) until samples
past it come, and at the latest until its interval closes, when it is folded with what came; at
most ``MAX_WAITING`` kernels wait per device, past that they are folded early. Python runs per
distinct name and per sample, never per record.

The numbers, per interval (the kernels that ended in it, as ``ActivityStats`` counts them), device
and kernel name (the top ``max_names`` by kernel time, NCCL names always, the rest as ``other``):

- ``mean[m]``: metric ``m`` over the samples the name's kernels ran in, each sample weighted by the
  name's overlap with it: ``sum_s w_s v_s / sum_s w_s``. A sample's value is the device's, over the
  whole sample: every kernel that ran in it, and its idle time, are in it.
- ``covered_share``: the name's kernel time that overlapped samples, over its kernel time. Samples
  lost, late past the interval's close, or before the first samples leave kernel time uncovered.
- ``own_share`` and ``all_share``: of the traced time of those samples, how much the name's own
  kernels filled, and how much all of the process's kernels did, weighted as the means are. An
  ``own_share`` near 1 says the reading is the kernel's own; ``all_share`` above ``own_share`` says
  other kernels shared its samples, above 1 that kernels ran at once (concurrent streams). Each
  kernel that ran at once gets the whole sample value, weighted by its overlap: the counters are the
  device's and cannot be split. Kernels of other processes on the device are not seen here (their
  streams attribute them): their rows of the same interval show them.

Budget mode: only kernels inside trace windows are known, so only the sample time they cover is
attributed, and the shares divide by the samples' traced time, not their whole length.
A change of a device's metric list (a new sampling session) starts its attribution afresh.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cuptistream.events import PmKernelStats, PmSamples

MAX_WAITING = 1 << 20  # kernels per device waiting for samples past their end (24 MiB)
OTHER = "other"

Traced = Callable[[int, int], int]  # ns of [low, high) traced for kernels


@dataclass
class _Device:
    """One device's samples (in time order, numbered from ``first``) and the kernels folded on them."""

    metrics: tuple[str, ...]
    first: int = 0  # number of ``starts[0]`` among all the device's samples
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    values: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (metrics, samples)
    waiting: list[tuple[np.ndarray, ...]] = field(default_factory=list)  # start, end, interval, name
    waiting_n: int = 0
    folded: dict[int, list[np.ndarray]] = field(default_factory=dict)  # interval -> (3, n): sample, name, ns
    kernel_ns: dict[int, np.ndarray] = field(default_factory=dict)  # interval -> ns per name id

    @property
    def newest(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0


class PmAttribution:
    """The attribution of one decode stream. Not thread-safe (the stream's thread)."""

    def __init__(self, interval_ns: int, max_names: int) -> None:
        self.interval_ns = interval_ns
        self.max_names = max_names
        self.names: list[str] = []  # name id -> name
        self._ids: dict[str, int] = {}
        self._labels: list[str] | None = None  # the accumulator's labels ``_lookup`` maps
        self._lookup = np.zeros(0, np.int64)
        self._devices: dict[int, _Device] = {}
        self.samples_refused = 0  # out of time order, or columns of unequal length
        self.folded_early = 0  # kernels folded before samples past them came (``MAX_WAITING``)

    # --- in ---------------------------------------------------------------------------------------

    def samples(self, event: PmSamples) -> None:
        """One ``PmSamples`` event of any device; folds the kernels that waited for them."""
        count = len(event.ends)
        if len(event.starts) != count or any(len(column) != count for column in event.values):
            self.samples_refused += count
            return
        metrics = tuple(event.metrics)
        device = self._devices.get(event.device_id)
        if device is None or device.metrics != metrics:
            device = self._devices[event.device_id] = _Device(metrics, values=np.zeros((len(metrics), 0)))
        if not count:
            return
        starts = np.asarray(event.starts, np.int64)
        ends = np.asarray(event.ends, np.int64)
        values = np.asarray(event.values, np.float64).reshape(len(metrics), count)
        # Samples of a device follow each other: one that starts before the last one ended is refused.
        before = np.concatenate([[device.newest], np.maximum.accumulate(ends)[:-1]])
        keep = (ends > starts) & (starts >= before)
        if not keep.all():
            self.samples_refused += int(np.count_nonzero(~keep))
            starts, ends, values = starts[keep], ends[keep], values[:, keep]
        device.starts = np.concatenate([device.starts, starts])
        device.ends = np.concatenate([device.ends, ends])
        device.values = np.concatenate([device.values, values], axis=1)
        if device.waiting:
            start, end, interval, name = (np.concatenate(c) for c in zip(*device.waiting, strict=True))
            ready = end <= device.newest
            self._fold(device, start[ready], end[ready], interval[ready], name[ready])
            device.waiting = [(start[~ready], end[~ready], interval[~ready], name[~ready])]
            device.waiting_n = int(np.count_nonzero(~ready))

    def kernels(
        self, interval: np.ndarray, device: np.ndarray, start: np.ndarray, end: np.ndarray,
        codes: np.ndarray, labels: list[str],
    ) -> None:  # fmt: skip
        """Kernel records the accumulator keeps: interval, device, start, end, and each one's name
        as ``labels[codes[i]]``. Devices without samples are passed over."""
        names = self._name_ids(codes, labels)
        one = device.min() == device.max()
        for dev in [int(device[0])] if one else np.unique(device).tolist():
            book = self._devices.get(dev)
            if book is None:
                continue
            rows = slice(None) if one else device == dev
            s, e, iv, nm = start[rows], end[rows], interval[rows], names[rows]
            self._count(book, iv, nm, e - s)
            ready = e <= book.newest
            if ready.all():
                self._fold(book, s, e, iv, nm)
                continue
            if ready.any():
                self._fold(book, s[ready], e[ready], iv[ready], nm[ready])
                s, e, iv, nm = s[~ready], e[~ready], iv[~ready], nm[~ready]
            book.waiting.append((s, e, iv, nm))
            book.waiting_n += len(s)
            if book.waiting_n > MAX_WAITING:  # samples stopped coming: fold with what came
                self._fold_waiting(book, None)

    def _name_ids(self, codes: np.ndarray, labels: list[str]) -> np.ndarray:
        """The accumulator's codes (which shift as it learns pointers) as this fold's stable ids."""
        if labels is not self._labels or len(self._lookup) != len(labels):
            ids = []
            for name in labels:  # once per distinct name pointer, when the labels change
                found = self._ids.get(name)
                if found is None:
                    found = self._ids[name] = len(self.names)
                    self.names.append(name)
                ids.append(found)
            self._labels, self._lookup = labels, np.asarray(ids, np.int64)
        return self._lookup[codes]

    @staticmethod
    def _count(book: _Device, interval: np.ndarray, name: np.ndarray, duration: np.ndarray) -> None:
        for at in np.unique(interval).tolist():
            rows = interval == at
            sums = np.bincount(name[rows], weights=duration[rows])
            held = book.kernel_ns.get(at)
            if held is None or len(held) < len(sums):
                grown = np.zeros(len(sums))
                if held is not None:
                    grown[: len(held)] = held
                held = book.kernel_ns[at] = grown
            held[: len(sums)] += sums

    def _fold(
        self, book: _Device, start: np.ndarray, end: np.ndarray, interval: np.ndarray, name: np.ndarray
    ) -> None:
        """Each kernel's overlap with each sample it ran in, summed per (interval, sample, name)."""
        if not len(start) or not len(book.ends):
            return
        first = np.searchsorted(book.ends, start, side="right")  # the first sample ending after it began
        after = np.searchsorted(book.starts, end, side="left")  # past the last sample starting before its end
        spans = np.maximum(after - first, 0)
        if spans.max() <= 1:  # the usual case: within one sample (or none)
            rows = np.flatnonzero(spans)
            sample = first[rows]
        else:  # straddlers: one row per sample they overlap
            rows = np.repeat(np.arange(len(start)), spans)
            sample = np.repeat(first - np.cumsum(spans) + spans, spans) + np.arange(len(rows))
        overlap = np.minimum(end[rows], book.ends[sample]) - np.maximum(start[rows], book.starts[sample])
        hit = overlap > 0
        if not hit.any():
            return
        rows, sample, overlap = rows[hit], sample[hit], overlap[hit]
        low_sample = int(sample.min())
        width = int(sample.max()) - low_sample + 1
        n_names = len(self.names)
        iv = interval[rows]
        low_iv = int(iv.min())
        key = ((iv - low_iv) * width + (sample - low_sample)) * n_names + name[rows]
        size = (int(iv.max()) - low_iv + 1) * width * n_names
        if size <= max(4 * len(key), 1 << 16):  # as the accumulator groups: bincount while it is small
            ns = np.bincount(key, weights=overlap, minlength=size)
            present = np.flatnonzero(ns)
            ns = ns[present]
        else:
            present, compact = np.unique(key, return_inverse=True)
            ns = np.bincount(compact, weights=overlap)
        name_of = present % n_names
        place = present // n_names
        for at in np.unique(place // width).tolist():
            groups = place // width == at
            block = np.stack([
                (place[groups] % width + low_sample + book.first).astype(np.float64),
                name_of[groups].astype(np.float64),
                ns[groups],
            ])  # fmt: skip
            book.folded.setdefault(at + low_iv, []).append(block)

    def _fold_waiting(self, book: _Device, interval: int | None) -> None:
        """Fold the waiting kernels of ``interval`` (None: all) with the samples there are."""
        if not book.waiting:
            return
        start, end, iv, name = (np.concatenate(c) for c in zip(*book.waiting, strict=True))
        now = np.ones(len(start), bool) if interval is None else iv <= interval
        if interval is None:
            self.folded_early += len(start)
        self._fold(book, start[now], end[now], iv[now], name[now])
        book.waiting = [(start[~now], end[~now], iv[~now], name[~now])] if not now.all() else []
        book.waiting_n = int(np.count_nonzero(~now))

    # --- out --------------------------------------------------------------------------------------

    def emit(self, interval: int, low: int, high: int, traced: Traced, traced_ns: int) -> list[PmKernelStats]:
        """The interval's rows, per device and name (``traced``: the stream's kernel-traced ns of
        a time range; ``traced_ns``: of the interval)."""
        events: list[PmKernelStats] = []
        for dev in sorted(self._devices):
            book = self._devices[dev]
            self._fold_waiting(book, interval)
            blocks = book.folded.pop(interval, [])
            kernel_ns = book.kernel_ns.pop(interval, None)
            if blocks and kernel_ns is not None:
                folded = np.concatenate(blocks, axis=1)
                events += self._rows(book, dev, low, high, folded, kernel_ns, traced, traced_ns)
        return events

    def _rows(
        self, book: _Device, device: int, low: int, high: int, folded: np.ndarray, kernel_ns: np.ndarray,
        traced: Traced, traced_ns: int,
    ) -> list[PmKernelStats]:  # fmt: skip
        position = folded[0].astype(np.int64) - book.first
        known = position >= 0  # samples forgotten already (a kernel longer than an interval): uncovered
        position, name, ns = position[known], folded[1][known].astype(np.int64), folded[2][known]
        if not len(ns):
            return []
        columns, column = np.unique(position, return_inverse=True)
        weight = np.zeros((len(kernel_ns), len(columns)))  # (name id, sample)
        np.add.at(weight, (name, column), ns)
        starts, ends = book.starts[columns], book.ends[columns]
        spans = zip(starts.tolist(), ends.tolist(), strict=True)
        sample_traced = np.array([traced(a, b) for a, b in spans], float)  # once per sample
        sample_traced = np.where(sample_traced > 0, sample_traced, ends - starts)
        all_kernels = weight.sum(axis=0)
        values = book.values[:, columns]
        valid = ~np.isnan(values)
        values = np.where(valid, values, 0.0)
        events = []
        for label, ids in self._groups(kernel_ns):
            w = weight[ids].sum(axis=0)
            covered = float(w.sum())
            if covered <= 0:
                continue  # no sample saw it: ActivityStats has its time, this has nothing to say
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = (values @ w) / (valid @ w)
            total = float(kernel_ns[ids].sum())
            events.append(PmKernelStats(
                interval_start=low, interval_end=high, device_id=device, name=label,
                kernel_ns=round(total), covered_ns=round(covered), covered_share=min(1.0, covered / total),
                samples=int(np.count_nonzero(w)), metrics=list(book.metrics), mean=[float(v) for v in mean],
                own_share=float((w * w / sample_traced).sum() / covered),
                all_share=float((w * all_kernels / sample_traced).sum() / covered),
                traced_ns=traced_ns,
            ))  # fmt: skip
        return events

    def _groups(self, kernel_ns: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """(name, name ids): the top ``max_names`` by kernel time and every NCCL name, each alone,
        the rest as ``other`` (as ``ActivityStats`` ranks them)."""
        present = np.flatnonzero(kernel_ns > 0)
        order = present[np.argsort(-kernel_ns[present], kind="stable")]
        kept = [i for i in order.tolist() if self.names[i] != OTHER][: self.max_names]
        kept += [i for i in order.tolist() if _is_nccl(self.names[i]) and i not in set(kept)]
        rest = [i for i in order.tolist() if i not in set(kept)]
        groups = [(self.names[i], np.array([i])) for i in kept]
        if rest:
            groups.append((OTHER, np.array(rest)))
        return groups

    def closed_until(self, time: int) -> None:
        """Every interval before ``time`` is closed: forget what no open one needs (samples ending
        more than one interval before it: a kernel reaching back further is uncovered there)."""
        for book in self._devices.values():
            before = time // self.interval_ns
            for table in (book.folded, book.kernel_ns):
                for old in [k for k in table if k < before]:
                    del table[old]
            cut = int(np.searchsorted(book.ends, time - self.interval_ns, side="left"))
            if cut:
                book.first += cut
                book.starts, book.ends, book.values = book.starts[cut:], book.ends[cut:], book.values[:, cut:]


def _is_nccl(name: str) -> bool:
    return name[:4].lower() == "nccl"
