"""``cuptistream compare``: the ranks of one job side by side, per interval and over the whole span.

Several recordings (``sources.Recordings``) are read as one job: one stream per writing process,
merged by time (``heapq.merge`` on each batch's earliest GPU start), so only the last few intervals
are open at any moment. Each batch's GPU work (``compare_read.GpuWork``) is folded into a ``Tally``
per (interval, rank) and one per rank for the whole span; an interval is closed, compared and handed
to ``on_interval`` once the merged stream is ``lateness`` past its end, then dropped. Memory grows
with the number of ranks and of distinct kernel names, not with the span.

Ranks are ``resource.rank``, or the (host, pid) of a process without one. Not compared, and listed
in ``CompareResult.ignored``: a process that did no GPU work (no kernel, copy or memset; e.g.
torchrun's launcher, which imports torch and so gets a probe), and, when some processes carry a
rank, every process without one (it is not a rank of the job). Intervals decide this with what has
been seen so far; the whole span with everything.

Ranks whose batches name the same GPU (``DeviceInfo.uuid``) share it; ``CompareResult.shared_devices``
lists them and the rule compares them on the work basis (``outliers.work_basis``). A kernel is NCCL when its
name contains ``nccl`` (any case); every other kernel is compute. Busy is the union of a rank's
kernels, copies and memsets over all its devices (overlap counts once), as a fraction of the span
of every rank's GPU work in the interval (one denominator for all ranks). A kernel's time counts in
the interval it starts in; busy time is split at interval edges.

``Tally`` (``compare_tally``) holds one rank's totals. Input types: a batch (``GpuWork``) brings raw
records, the collector's statistics events (``compare_stats.StatsWork``: the always-on mode's
recordings have only these), or both. Each goes to its own ``Tally`` of (interval, rank), and the
basis is decided per rank when an interval or the span is compared: its raw records where it has
any, else its statistics (a ``full`` recording with statistics on holds both, and they must not
count twice). Nothing after ``Tally`` depends on which. Statistics count their ``estimated_*``
values; each row's ``basis`` says where the numbers came from and, for estimates, how much of the
time was traced. A rank compared on estimates is an outlier over the whole span only where its
intervals bear the flag out (``outliers.borne_out``). A statistics interval counts whole in the
compare interval its start falls in, so the compare interval must be a multiple of it
(``compare_stats.StatisticsIntervalError`` otherwise: the numbers cannot be split), for the ranks
compared on their statistics: it is raised when the first interval closes or at ``finish``, and not
for a rank that has raw records.

Hardware counters: where the recordings carry PmKernelStats (PM sampling attributed to kernels),
each flagged rank's longer kernels get the rank's and the other ranks' utilization and a verdict,
less efficient or more work (``compare_hardware``); without them the output is as before.

Failure modes: a batch whose work starts before an interval that was already closed is "late": it
counts in the whole-span totals and in ``late_events``, not in its interval's row.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cuptistream import events as ev
from cuptistream.analysis.aggregate import KeyIndex
from cuptistream.analysis.compare_hardware import verdicts
from cuptistream.analysis.compare_read import GpuWork, gpu_work
from cuptistream.analysis.compare_stats import StatisticsIntervalError, StatsWork, nest
from cuptistream.analysis.compare_tally import Tally
from cuptistream.analysis.names import DisplayNames
from cuptistream.analysis.outliers import (
    SHARED_RULE,
    Flag,
    Rule,
    borne_out,
    cause,
    flag_all,
    kernel_differences,
    work_basis,
)
from cuptistream.analysis.records import Part
from cuptistream.analysis.select import Selection
from cuptistream.analysis.summary_kernel_hardware import NameTotals

RankKey = tuple[Any, ...]  # (rank,) or ("pid", host, pid)
# One operation's time is cut to [0, this]: a record with a corrupt end must not open an interval per
# 10 s up to the end of time, nor swamp the totals. No kernel or copy runs this long.
_MAX_OP_NS = 3600 * 1_000_000_000


def rank_key(resource: ev.Resource) -> RankKey:
    return (resource.rank,) if resource.rank is not None else ("pid", resource.host, resource.pid)


def rank_label(key: RankKey) -> str:
    return f"rank {key[0]}" if len(key) == 1 else f"pid {key[2]}@{key[1]}"


@dataclass
class _Interval:
    start: int
    end: int
    tallies: dict[RankKey, Tally] = field(default_factory=dict)
    stats: dict[RankKey, Tally] = field(default_factory=dict)  # from statistics events


@dataclass
class _RankInfo:
    hosts: set[str] = field(default_factory=set)
    pids: set[int] = field(default_factory=set)
    worked: bool = False  # any kernel, copy or memset (raw, or in statistics)
    raw: bool = False  # any raw kernel, copy or memset: compared on its records, not its statistics
    unnested: StatisticsIntervalError | None = None  # its statistics do not fit --interval (unused)
    devices: dict[str, str] = field(default_factory=dict)  # uuid -> GPU name, of batches with GPU work


@dataclass
class IntervalResult:
    """One closed interval: a row per rank, the flags of the rule, the top kernels' names."""

    start_unix_ns: int
    end_unix_ns: int
    span_ns: int
    rows: list[dict[str, Any]]
    flags: list[Flag]
    top_kernels: list[str]


@dataclass
class CompareResult:
    """The whole span: a row per rank, the flags, and per flagged rank its cause and kernels;
    the processes not compared (``ignored``) and the GPUs that ranks share (``shared_devices``)."""

    total: IntervalResult
    outliers: list[dict[str, Any]]
    rule: Rule
    intervals: int
    late_events: int
    batches: int
    interval_ns: int
    ignored: list[dict[str, Any]] = field(default_factory=list)
    shared_devices: list[dict[str, Any]] = field(default_factory=list)
    statistics_interval_ns: int | None = None  # the statistics' interval, where a rank used them
    hardware: bool = False  # PmKernelStats were read: outliers carry ``kernels_hardware``


class Comparer:
    """Folds GPU work into per-rank tallies per interval and over the whole span (module docstring)."""

    def __init__(
        self,
        on_interval: Callable[[IntervalResult], None],
        *,
        interval_ns: int = 10_000_000_000,
        lateness_ns: int | None = None,
        rule: Rule | None = None,
        top: int = 5,
        names: DisplayNames | None = None,
        devices: frozenset[int] | None = None,
    ) -> None:
        self.on_interval = on_interval
        self.interval_ns = interval_ns
        self.lateness_ns = max(interval_ns, 5_000_000_000) if lateness_ns is None else lateness_ns
        self.rule = rule or Rule()
        self.top = top
        self.display = names or DisplayNames()
        self.devices = devices  # the CUDA ordinals compared (``--device``); None: all
        self.codes = KeyIndex()  # kernel name as recorded -> code
        self._nccl = np.zeros(0, bool)  # by code
        self._open: dict[int, _Interval] = {}  # by interval index
        self._closed_below = -(2**62)  # indexes below this are closed
        self.whole: dict[RankKey, Tally] = {}
        self.stats_whole: dict[RankKey, Tally] = {}  # from statistics events
        self.stats_interval_ns: int | None = None
        self.ranks: dict[RankKey, _RankInfo] = {}
        # rank -> kernel name as recorded -> its PmKernelStats over the span (``compare_hardware``)
        self.hardware: dict[RankKey, dict[str, NameTotals]] = {}
        self.flagged_intervals: dict[RankKey, int] = {}
        self.compared_intervals: dict[RankKey, int] = {}  # intervals with a row for the rank
        self.intervals = 0
        self.late_events = 0
        self.batches = 0

    # --- folding --------------------------------------------------------------------------------

    def add_work(self, work: GpuWork) -> None:
        """Fold one batch's GPU work (raw records) into its rank's tallies."""
        self.batches += 1
        key = rank_key(work.resource)
        info = self.ranks.get(key)
        if info is None:
            info = self.ranks[key] = _RankInfo()
            self.whole[key] = Tally(busy=False)
            self.stats_whole[key] = Tally(busy=False, statistics=True)
        info.hosts.add(work.resource.host)
        info.pids.add(work.resource.pid)
        for st in work.hardware:  # counters, not work: they leave ``worked`` as it is
            self.hardware.setdefault(key, {}).setdefault(st.name, NameTotals()).add(st)
        if work.empty and not work.stats:
            return
        info.worked = True
        for device in work.resource.devices:
            if device.uuid and (self.devices is None or device.device_id in self.devices):
                info.devices[device.uuid] = device.name
        if work.stats:
            self._add_stats(key, work.stats)
        if work.empty:
            return
        info.raw = True
        self.display.learn(work.carried)
        whole = self.whole[key]
        size = self.interval_ns
        codes = self._codes(work.kernel_names)
        kdur = np.clip(work.kernel_end - work.kernel_start, 0, _MAX_OP_NS)
        cdur = np.clip(work.copy_end - work.copy_start, 0, _MAX_OP_NS)
        whole.add_kernels(codes, kdur, self._nccl, len(self.codes.keys_))
        whole.add_copies(cdur, work.copy_bytes)
        starts = np.concatenate([work.kernel_start, work.copy_start, work.memset_start])
        ends = np.concatenate([work.kernel_end, work.copy_end, work.memset_end])
        ends = np.clip(ends, starts, starts + _MAX_OP_NS)
        whole.reach(int(starts.min()), int(ends.max()))
        kiv = work.kernel_start // size
        civ = work.copy_start // size
        for index in np.unique(np.concatenate([kiv, civ])).tolist():
            interval = self._interval(index)
            if interval is None:
                self.late_events += int((kiv == index).sum() + (civ == index).sum())
                continue
            tally = self._tally(interval, key)
            mask = kiv == index
            if mask.any():
                tally.add_kernels(codes[mask], kdur[mask], self._nccl, len(self.codes.keys_))
            mask = civ == index
            if mask.any():
                tally.add_copies(cdur[mask], work.copy_bytes[mask])
        self._busy(key, starts, ends)

    def _add_stats(self, key: RankKey, stats: StatsWork) -> None:
        """Fold one batch's statistics rows into the rank's statistics tallies (module docstring)."""
        whole = self.stats_whole[key]
        spans = stats.spans()
        info = self.ranks[key]
        try:
            for start, end in spans:
                self.stats_interval_ns = nest(self.interval_ns, self.stats_interval_ns, end - start)
        except StatisticsIntervalError as error:
            # an error only for a rank compared on its statistics: a full recording with
            # statistics on is compared on its raw records, at any --interval (_check_nesting)
            info.unnested = info.unnested or error
            return
        n_names = len(self.codes.keys_)
        if stats.kernels:
            codes = self._codes([row[2] for row in stats.kernels])
            n_names = len(self.codes.keys_)
            counts = np.array([row[3] for row in stats.kernels], np.int64)
            ns = np.array([row[4] for row in stats.kernels], np.int64)
            measured = np.array([row[5] for row in stats.kernels], np.int64)
            estimated = np.array([row[6] for row in stats.kernels], bool)
            starts = np.array([row[0] for row in stats.kernels], np.int64)
            whole.add_stat_kernels(codes, ns, measured, estimated, counts, self._nccl, n_names)
            for index in np.unique(starts // self.interval_ns).tolist():
                mask = starts // self.interval_ns == index
                tally = self._stats_tally(index, key)
                if tally is None:
                    # a rank with raw records is not compared on its statistics: not late for it
                    self.late_events += 0 if self.ranks[key].raw else int(mask.sum())
                else:
                    picked = (codes[mask], ns[mask], measured[mask], estimated[mask], counts[mask])
                    tally.add_stat_kernels(*picked, self._nccl, n_names)
        for start, _, ns_, nbytes in stats.copies:
            for tally in (whole, self._stats_tally(start // self.interval_ns, key)):
                if tally is not None:
                    tally.copy_ns += ns_
                    tally.copy_bytes += nbytes
        for start, _, busy, scaled in stats.gpu:
            for tally in (whole, self._stats_tally(start // self.interval_ns, key)):
                if tally is not None:
                    tally.busy_ns += busy
                    tally.estimated |= scaled
        for start, end in spans:
            whole.reach(start, end)
            assert whole.seen is not None
            whole.seen.add(start, end - start)
            tally = self._stats_tally(start // self.interval_ns, key)
            if tally is not None:
                tally.reach(start, end)

    def _stats_tally(self, index: int, key: RankKey) -> Tally | None:
        """The rank's statistics tally of interval ``index``; None when it is closed (late)."""
        interval = self._interval(index)
        if interval is None:
            return None
        tally = interval.stats.get(key)
        if tally is None:
            tally = interval.stats[key] = Tally(busy=False, statistics=True)
        return tally

    def _codes(self, names: list[str]) -> np.ndarray:
        codes = self.codes.codes(names, len(names))
        known = len(self._nccl)
        if len(self.codes.keys_) > known:
            fresh = ["nccl" in name.lower() for name in self.codes.keys_[known:]]
            self._nccl = np.concatenate([self._nccl, np.array(fresh, bool)])
        return codes

    def _busy(self, key: RankKey, starts: np.ndarray, ends: np.ndarray) -> None:
        size = self.interval_ns
        first_iv = starts // size
        last_iv = np.maximum(ends - 1, starts) // size
        cross = np.flatnonzero(last_iv > first_iv)
        if len(cross):  # split work that crosses an interval edge (rare at 10 s)
            extra_s, extra_e = [], []
            for i in cross.tolist():
                for index in range(int(first_iv[i]) + 1, int(last_iv[i]) + 1):
                    extra_s.append(index * size)
                    extra_e.append(min(int(ends[i]), (index + 1) * size))
            ends = ends.copy()
            ends[cross] = (first_iv[cross] + 1) * size
            starts = np.concatenate([starts, np.array(extra_s, np.int64)])
            ends = np.concatenate([ends, np.array(extra_e, np.int64)])
            first_iv = starts // size
        for index in np.unique(first_iv).tolist():
            interval = self._interval(index)
            if interval is None:
                continue
            mask = first_iv == index
            s, e = starts[mask], ends[mask]
            tally = self._tally(interval, key)
            assert tally.busy is not None
            tally.busy.add(s, e)
            tally.reach(int(s.min()), int(e.max()))

    def _interval(self, index: int) -> _Interval | None:
        if index < self._closed_below:
            return None
        interval = self._open.get(index)
        if interval is None:
            interval = self._open[index] = _Interval(index * self.interval_ns, (index + 1) * self.interval_ns)
        return interval

    def _tally(self, interval: _Interval, key: RankKey) -> Tally:
        tally = interval.tallies.get(key)
        if tally is None:
            tally = interval.tallies[key] = Tally(busy=True)
        return tally

    # --- closing --------------------------------------------------------------------------------

    def advance(self, watermark_ns: int) -> None:
        """Close every interval that ends ``lateness`` or more before ``watermark_ns``."""
        limit = (watermark_ns - self.lateness_ns) // self.interval_ns  # intervals below it end in time
        for index in sorted(i for i in self._open if i < limit):
            self._close(index)
        self._closed_below = max(self._closed_below, limit)

    def _check_nesting(self) -> None:
        """Raise the ``StatisticsIntervalError`` of a rank that has only statistics to compare."""
        for key in self.compared():
            info = self.ranks[key]
            if info.unnested is not None and not info.raw:
                raise info.unnested

    def _close(self, index: int) -> None:
        self._check_nesting()
        interval = self._open.pop(index)
        self.intervals += 1
        for key, tally in interval.tallies.items():
            assert tally.busy is not None
            tally.busy_ns = tally.busy.total_ns
            self.whole[key].busy_ns += tally.busy_ns
        picked = {key: self._pick(interval, key) for key in self.compared()}
        tallies = {key: tally for key, tally in picked.items() if tally is not None}
        lo, hi = _reach(tallies.values())
        result = self._result(interval.start, interval.end, hi - lo, tallies)
        for key in tallies:
            self.compared_intervals[key] = self.compared_intervals.get(key, 0) + 1
        for flagged in {f.rank for f in result.flags}:
            key = next(k for k in self.ranks if rank_label(k) == flagged)
            self.flagged_intervals[key] = self.flagged_intervals.get(key, 0) + 1
        self.on_interval(result)

    def _pick(self, interval: _Interval, key: RankKey) -> Tally | None:
        """The rank's raw tally where it has raw records (so far), else its statistics tally; None
        for a statistics rank without statistics in the interval: the collector traced none of it
        (a budget-mode gap), which says nothing of its work, so it is left out, not counted 0."""
        if self.ranks[key].raw:
            return interval.tallies.get(key) or Tally(busy=True)
        return interval.stats.get(key)

    def _whole(self, key: RankKey) -> Tally:
        """The rank's whole-span tally. From statistics with gaps (intervals inside its span without
        statistics), scaled to the whole span, so a gap is not read as a rank doing less."""
        if self.ranks[key].raw:
            return self.whole[key]
        tally = self.stats_whole[key]
        seen = tally.seen
        if seen is None or not seen.count or tally.lo is None or tally.hi is None:
            return tally
        span = round((tally.hi - tally.lo) / seen.length)
        if span <= seen.count:
            return tally
        scaled = tally.scaled(span / seen.count)
        scaled.gaps = (seen.count, span)
        return scaled

    def compared(self) -> list[RankKey]:
        """The processes compared so far: those that did GPU work, and only ranks when some have one."""
        ranked = any(len(key) == 1 for key in self.ranks)
        return [k for k, info in self.ranks.items() if info.worked and (len(k) == 1 or not ranked)]

    def ignored(self) -> list[dict[str, Any]]:
        """The processes not compared, each with why."""
        ranked = sum(len(key) == 1 for key in self.ranks)
        out = []
        for key, info in sorted(self.ranks.items(), key=lambda kv: _order(kv[0])):
            why = []
            if len(key) != 1 and ranked:
                why.append(f"no rank, while {ranked} process(es) carry one: not a rank of the job")
            if not info.worked:
                why.append("no GPU work over the span (no kernel, copy or memset)")
            if why:
                tally = self._whole(key)
                out.append(
                    {"rank": rank_label(key), "hosts": sorted(info.hosts), "pids": sorted(info.pids),
                     "kernels": tally.kernels, "copy_bytes": tally.copy_bytes, "reason": "; ".join(why)}
                )  # fmt: skip
        return out

    def shared_devices(self, keys: Sequence[RankKey] | None = None) -> list[dict[str, Any]]:
        """The GPUs (by UUID) that two or more of ``keys`` (default: the compared ones) ran work on."""
        users: dict[str, list[RankKey]] = {}
        names: dict[str, str] = {}
        for key in self.compared() if keys is None else keys:
            for uuid, name in self.ranks[key].devices.items():
                users.setdefault(uuid, []).append(key)
                names[uuid] = name
        return [
            {
                "uuid": uuid,
                "name": names[uuid],
                "ranks": [rank_label(k) for k in sorted(ks, key=_order)],
                "hosts": sorted({h for k in ks for h in self.ranks[k].hosts}),
                "rule": SHARED_RULE,
            }
            for uuid, ks in sorted(users.items())
            if len(ks) > 1
        ]

    def _result(self, start: int, end: int, span: int, tallies: dict[RankKey, Tally]) -> IntervalResult:
        n = len(self.codes.keys_)
        matrix = np.zeros((len(tallies), n), np.int64)
        counts = np.zeros((len(tallies), n), np.int64)
        for row, tally in enumerate(tallies.values()):
            matrix[row, : len(tally.kernel_ns)] = tally.kernel_ns[:n]
            counts[row, : len(tally.kernel_count)] = tally.kernel_count[:n]
        sharing = {label for d in self.shared_devices(list(tallies)) for label in d["ranks"]}
        shared = [row for row, key in enumerate(tallies) if rank_label(key) in sharing]
        keys = list(tallies)
        work = {
            rank_label(keys[row]): values
            for row, values in work_basis(
                matrix, counts, self._nccl[:n], shared, self.rule, [t.estimated for t in tallies.values()]
            ).items()
        }
        top = np.argsort(-matrix.sum(axis=0), kind="stable")[: self.top]
        top = top[matrix.sum(axis=0)[top] > 0]
        names = [self.display(self.codes.keys_[i]) for i in top.tolist()]
        rows = []
        position = {key: row for row, key in enumerate(tallies)}  # the key's row of ``matrix``
        for key, tally in sorted(tallies.items(), key=lambda kv: _order(kv[0])):
            info = self.ranks[key]
            mine = matrix[position[key]]
            rows.append(
                {
                    "rank": rank_label(key),
                    "rank_id": key[0] if len(key) == 1 else None,
                    "hosts": sorted(info.hosts),
                    "pids": sorted(info.pids),
                    "busy_fraction": round(tally.busy_ns / span, 6) if span else 0.0,
                    "busy_ns": tally.busy_ns,
                    "compute_ns": tally.compute_ns,
                    "nccl_ns": tally.nccl_ns,
                    "copy_ns": tally.copy_ns,
                    "copy_bytes": tally.copy_bytes,
                    "kernels": tally.kernels,
                    "top_kernels": {name: int(mine[i]) for name, i in zip(names, top.tolist(), strict=True)},
                    "basis": tally.basis(),
                }
            )
        return IntervalResult(start, end, span, rows, flag_all(rows, self.rule, work), names)

    def finish(self) -> CompareResult:
        """Close every open interval; the whole span's rows, flags and flagged ranks' kernels."""
        for index in sorted(self._open):
            self._close(index)
        self._check_nesting()
        keys = self.compared()
        whole = {key: self._whole(key) for key in keys}
        lo, hi = _reach(whole.values())
        total = self._result(lo, hi, hi - lo, whole)
        total = replace(total, flags=self._held(total))
        return CompareResult(
            total=total,
            outliers=self._outliers(total.flags, keys),
            rule=self.rule,
            intervals=self.intervals,
            late_events=self.late_events,
            batches=self.batches,
            interval_ns=self.interval_ns,
            ignored=self.ignored(),
            shared_devices=self.shared_devices(keys),
            statistics_interval_ns=None if all(self.ranks[k].raw for k in keys) else self.stats_interval_ns,
            hardware=bool(self.hardware),
        )

    def _held(self, total: IntervalResult) -> list[Flag]:
        """The whole span's flags, less those of an estimated rank that its intervals do not bear
        out (``outliers.borne_out``)."""
        estimated = {r["rank"] for r in total.rows if str(r["basis"]).startswith("statistics (estimated")}
        by_label = {rank_label(key): key for key in self.compared()}
        return [
            f
            for f in total.flags
            if f.rank not in estimated
            or borne_out(
                self.flagged_intervals.get(by_label[f.rank], 0),
                self.compared_intervals.get(by_label[f.rank], 0),
            )
        ]

    def _outliers(self, flags: Sequence[Flag], keys: list[RankKey]) -> list[dict[str, Any]]:
        if not flags:
            return []
        n = len(self.codes.keys_)
        ns = np.zeros((len(keys), n), np.int64)
        counts = np.zeros((len(keys), n), np.int64)
        for row, key in enumerate(keys):
            tally = self._whole(key)
            ns[row, : len(tally.kernel_ns)] = tally.kernel_ns[:n]
            counts[row, : len(tally.kernel_count)] = tally.kernel_count[:n]
        median_ns = np.median(ns, axis=0)
        median_count = np.median(counts, axis=0)
        pair = len(keys) == 2  # a pair's rank is compared with its peer (outliers.flag_pair)
        names = [self.display(name) for name in self.codes.keys_]
        out = []
        by_rank: dict[str, list[Flag]] = {}
        for f in flags:
            by_rank.setdefault(f.rank, []).append(f)
        hardware = {key: self._hardware_shown(key) for key in keys} if self.hardware else None
        for label, rank_flags in sorted(by_rank.items(), key=lambda kv: _label_order(kv[0], keys)):
            row = next(i for i, k in enumerate(keys) if rank_label(k) == label)
            ref_ns, ref_count = (ns[1 - row], counts[1 - row]) if pair else (median_ns, median_count)
            longer, shorter = kernel_differences(names, ns[row], counts[row], ref_ns, ref_count, self.top)
            outlier = {
                "rank": label,
                "metrics": [f.as_dict() for f in rank_flags],
                "cause": cause(rank_flags),
                "kernels_longer": longer,
                "kernels_shorter": shorter,
                "flagged_intervals": self.flagged_intervals.get(keys[row], 0),
                "intervals": self.intervals,
            }
            if hardware is not None:  # only where the recordings carry PmKernelStats
                others = [hardware[k] for k in keys if k != keys[row]]
                estimated = self._whole(keys[row]).estimated
                more = self.rule.estimate_tolerance if estimated else self.rule.min_relative
                outlier["kernels_hardware"] = verdicts(longer, hardware[keys[row]], others, more)
            out.append(outlier)
        return out

    def _hardware_shown(self, key: RankKey) -> dict[str, NameTotals]:
        """The rank's PmKernelStats totals by displayed name (names that display alike merged)."""
        shown: dict[str, NameTotals] = {}
        for name, totals in self.hardware.get(key, {}).items():
            shown.setdefault(self.display(name), NameTotals()).merge(totals)
        return shown


def _reach(tallies: Iterable[Tally]) -> tuple[int, int]:
    """The span (lo, hi) of the tallies' GPU work; (0, 0) without any."""
    los = [t.lo for t in tallies if t.lo is not None]
    his = [t.hi for t in tallies if t.hi is not None]
    return (min(los), max(his)) if los and his else (0, 0)


def _order(key: RankKey) -> tuple[int, Any]:
    return (0, key[0]) if len(key) == 1 else (1, key[1:])


def _label_order(label: str, keys: Sequence[RankKey]) -> tuple[int, Any]:
    return next((_order(k) for k in keys if rank_label(k) == label), (2, label))


def merged_work(streams: Sequence[Iterator[Part]], selection: Selection) -> Iterator[GpuWork]:
    """The GPU work of every stream, merged by each batch's earliest start (one batch per stream held)."""

    def keyed(stream: Iterator[Part]) -> Iterator[GpuWork]:
        last = -(2**62)
        for part in stream:
            work = gpu_work(part, selection, last)
            if work is not None:
                last = work.first
                yield work

    return heapq.merge(*(keyed(s) for s in streams), key=lambda w: w.first)


def compare_streams(
    streams: Sequence[Iterator[Part]],
    on_interval: Callable[[IntervalResult], None],
    *,
    selection: Selection | None = None,
    **options: Any,
) -> CompareResult:
    """Compare the ranks in ``streams`` (``sources.Recordings.streams()``); ``options``: ``Comparer``'s."""
    selection = selection or Selection()
    comparer = Comparer(on_interval, devices=selection.devices, **options)
    for work in merged_work(streams, selection):
        comparer.advance(work.first)
        comparer.add_work(work)
    return comparer.finish()
