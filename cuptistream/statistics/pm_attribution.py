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
- ``covered_share``: the name's kernel time that overlapped samples, over its kernel time (its
  ``ActivityStats`` total, which the accumulator hands over at the close). Kernels before the first
  samples came, in gaps between samples, or whose samples were lost or came after the interval
  closed are uncovered.
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

from cuptistream.events import PmKernelStats, PmSamples, nan_as_none

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
    # interval -> (sample number, name id, overlap ns) arrays, one triple per fold
    folded: dict[int, list[tuple[np.ndarray, ...]]] = field(default_factory=dict)

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
        one = device.min() == device.max()
        devices = [int(device[0])] if one else np.unique(device).tolist()
        if not any(dev in self._devices for dev in devices):
            return
        names = self._name_ids(codes, labels)
        for dev in devices:
            book = self._devices.get(dev)
            if book is None:
                continue
            rows = slice(None) if one else device == dev
            s, e, iv, nm = start[rows], end[rows], interval[rows], names[rows]
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
        iv = interval[rows]
        low_iv, high_iv = int(iv.min()), int(iv.max())
        low_sample = int(sample.min())
        width, n_names = int(sample.max()) - low_sample + 1, len(self.names)
        key = (sample - low_sample) * n_names + name[rows]
        if high_iv != low_iv:
            key += (iv - low_iv) * (width * n_names)
        size = (high_iv - low_iv + 1) * width * n_names
        if size <= max(4 * len(key), 1 << 16):  # as the accumulator groups: bincount while it is small
            ns = np.bincount(key, weights=overlap, minlength=size)
            present = np.flatnonzero(ns)
            ns = ns[present]
        else:
            present, compact = np.unique(key, return_inverse=True)
            ns = np.bincount(compact, weights=overlap)
        within = present % (width * n_names)
        sample_of, name_of = within // n_names + (low_sample + book.first), within % n_names
        if high_iv == low_iv:
            book.folded.setdefault(low_iv, []).append((sample_of, name_of, ns))
            return
        place = present // (width * n_names)
        for at in np.unique(place).tolist():
            at_rows = place == at
            triple = (sample_of[at_rows], name_of[at_rows], ns[at_rows])
            book.folded.setdefault(at + low_iv, []).append(triple)

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

    def emit(
        self, interval: int, low: int, high: int, kernel_ns: dict[int, dict[str, int]], traced: Traced,
        traced_ns: int,
    ) -> list[PmKernelStats]:  # fmt: skip
        """The interval's rows, per device and name. ``kernel_ns``: per device, each name's kernel
        time in the interval (the accumulator's ``ActivityStats`` totals); ``traced``: the stream's
        kernel-traced ns of a time range; ``traced_ns``: of the interval."""
        events: list[PmKernelStats] = []
        for dev in sorted(self._devices):
            book = self._devices[dev]
            self._fold_waiting(book, interval)
            blocks = book.folded.pop(interval, [])
            if blocks and kernel_ns.get(dev):
                folded = tuple(np.concatenate(c) for c in zip(*blocks, strict=True))
                events += self._rows(book, dev, low, high, folded, kernel_ns[dev], traced, traced_ns)
        return events

    def _rows(
        self, book: _Device, device: int, low: int, high: int, folded: tuple[np.ndarray, ...],
        kernel_ns: dict[str, int], traced: Traced, traced_ns: int,
    ) -> list[PmKernelStats]:  # fmt: skip
        position = folded[0] - book.first
        known = position >= 0  # samples forgotten already (a kernel longer than an interval): uncovered
        position, name, ns = position[known], folded[1][known], folded[2][known]
        if not len(ns):
            return []
        columns, column = np.unique(position, return_inverse=True)
        ids, row = np.unique(name, return_inverse=True)
        weight = np.zeros((len(ids), len(columns)))  # (name, sample)
        np.add.at(weight, (row, column), ns)
        row_of = {self.names[i]: r for r, i in enumerate(ids.tolist())}
        starts, ends = book.starts[columns], book.ends[columns]
        spans = zip(starts.tolist(), ends.tolist(), strict=True)
        sample_traced = np.array([traced(a, b) for a, b in spans], float)  # once per sample
        sample_traced = np.where(sample_traced > 0, sample_traced, ends - starts)
        all_kernels = weight.sum(axis=0)
        values = book.values[:, columns]
        valid = ~np.isnan(values)
        values = np.where(valid, values, 0.0)
        events = []
        for label, members in self._groups(kernel_ns):
            w = weight[[row_of[n] for n in members if n in row_of]].sum(axis=0)
            covered = float(w.sum())
            if covered <= 0:
                continue  # no sample saw it: ActivityStats has its time, this has nothing to say
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = (values @ w) / (valid @ w)
            total = max(float(sum(kernel_ns[n] for n in members)), covered)
            events.append(PmKernelStats(
                interval_start=low, interval_end=high, device_id=device, name=label,
                kernel_ns=round(total), covered_ns=round(covered), covered_share=min(1.0, covered / total),
                samples=int(np.count_nonzero(w)), metrics=list(book.metrics), mean=nan_as_none(mean),
                own_share=float((w * w / sample_traced).sum() / covered),
                all_share=float((w * all_kernels / sample_traced).sum() / covered),
                traced_ns=traced_ns,
            ))  # fmt: skip
        return events

    def _groups(self, kernel_ns: dict[str, int]) -> list[tuple[str, list[str]]]:
        """(label, names): the top ``max_names`` by kernel time and every NCCL name, each alone,
        the rest as ``other`` (as ``ActivityStats`` ranks them: Python once per name)."""
        order = sorted(kernel_ns, key=lambda n: -kernel_ns[n])
        kept = [n for n in order if n != OTHER][: self.max_names]
        kept += [n for n in order if _is_nccl(n) and n not in set(kept)]
        rest = [n for n in order if n not in set(kept)]
        groups = [(n, [n]) for n in kept]
        if rest:
            groups.append((OTHER, rest))
        return groups

    def closed_until(self, time: int) -> None:
        """Every interval before ``time`` is closed: forget what no open one needs (samples ending
        more than one interval before it: a kernel reaching back further is uncovered there)."""
        for book in self._devices.values():
            before = time // self.interval_ns
            for old in [k for k in book.folded if k < before]:
                del book.folded[old]
            cut = int(np.searchsorted(book.ends, time - self.interval_ns, side="left"))
            if cut:
                book.first += cut
                book.starts, book.ends, book.values = book.starts[cut:], book.ends[cut:], book.values[:, cut:]


def _is_nccl(name: str) -> bool:
    return name[:4].lower() == "nccl"
