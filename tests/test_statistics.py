"""The collector's statistics (``cuptistream.statistics``) against the raw events of the same GPU
captures: counts, sums, histogram buckets recomputed here with plain Python, the busy union, the
coverage and its estimates, closing intervals, the name cap, and the collector's stream-level
handling of trace spans (``WindowRecords``, ``records: on_demand``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cuptistream.channel.messages import OpenStream, TraceSpan
from cuptistream.collector.buffer_decoder import Decoder
from cuptistream.collector.decoding import DecodeStream
from cuptistream.config.model import StatisticsConfig
from cuptistream.cupti import capture
from cuptistream.cupti.names import TableNames
from cuptistream.cupti.records import RecordLayouts
from cuptistream.events import ActivityStats, Event, GpuStats, Histogram, Kernel, Memcpy, Memset
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURE_DIR  # shipped real-GPU captures
from cuptistream.statistics import LATENESS_NS, Accumulator
from cuptistream.statistics.histogram import DENSE, LOWEST, MAX_BUCKETS, SCALE, to_histogram
from cuptistream.statistics.launch_rate import LaunchRate
from tests.gpu.workloads.collect import Collect

CAPTURES = ["exact_counts", "torch_train"]  # graph_trace holds no kernel, copy or memset records
SECOND = 1_000_000_000


def _decode(
    name: str, interval_ns: int, max_names: int = 10_000
) -> tuple[list[Event], list[Event], Accumulator]:
    """The capture's raw events (Struct path) and the statistics folded from the same arrays."""
    cap = capture.read(CAPTURE_DIR / f"{name}.cupti")
    names = TableNames(cap.strings)
    acc = Accumulator(interval_ns, max_names, names)
    decoder = Decoder(names, RecordLayouts(dict(cap.struct_sizes)), observer=lambda k, e, r: acc.add(e, r))
    raw: list[Event] = []
    stats: list[Event] = []
    for buf in cap.buffers:
        raw += decoder.decode(buf.data, len(buf.data))
        stats += acc.buffer_done()
    return raw, stats + acc.close(), acc


def _bucket(duration: int) -> int:
    """OTLP's index at scale 2 by its definition, in exact integers: the i with
    2**(i/4) < v <= 2**((i+1)/4), i.e. 2**i < v**4 <= 2**(i+1)."""
    return (duration ** (2**SCALE) - 1).bit_length() - 1


def _histogram_counts(h: Histogram, scale_to: int = SCALE) -> dict[int, int]:
    assert h.scale == scale_to
    return {h.offset + k: c for k, c in enumerate(h.counts) if c}


def _raw_groups(raw: list[Event], interval_ns: int) -> dict[tuple[int, int, str, str], list[Any]]:
    groups: dict[tuple[int, int, str, str], list[Any]] = defaultdict(list)
    for e in raw:
        if isinstance(e, Kernel):
            key = (e.end // interval_ns * interval_ns, e.device_id, "kernel", e.name)
        elif isinstance(e, Memcpy):
            key = (e.end // interval_ns * interval_ns, e.device_id, "memcpy", e.copy_kind)
        elif isinstance(e, Memset):
            key = (e.end // interval_ns * interval_ns, e.device_id, "memset", e.memory_kind)
        else:
            continue
        groups[key].append(e)
    return groups


@pytest.mark.parametrize("name", CAPTURES)
@pytest.mark.parametrize("interval", [SECOND, 10 * SECOND])
def test_statistics_equal_the_raw_events_of_the_capture(name: str, interval: int) -> None:
    raw, stats, acc = _decode(name, interval)
    groups = _raw_groups(raw, interval)
    rows = {
        (s.interval_start, s.device_id, s.category, s.name): s for s in stats if isinstance(s, ActivityStats)
    }
    assert groups and set(rows) == set(groups)
    for key, events in groups.items():
        row = rows[key]
        durations = [e.end - e.start for e in events]
        assert (row.count, row.total_ns) == (len(events), sum(durations))
        assert row.bytes == sum(getattr(e, "bytes", 0) for e in events)
        assert (row.durations.min, row.durations.max) == (min(durations), max(durations))
        want: dict[int, int] = defaultdict(int)
        for d in durations:
            want[_bucket(d)] += 1
        assert _histogram_counts(row.durations) == dict(want)
        assert row.durations.zero_count == sum(1 for d in durations if d == 0)
    assert acc.late_records == acc.invalid_records == acc.untraced_records == 0


@pytest.mark.parametrize("name", CAPTURES)
def test_gpu_busy_is_the_union_of_the_operations_within_each_interval(name: str) -> None:
    interval = SECOND
    raw, stats, _ = _decode(name, interval)
    ops = sorted((e.start, e.end) for e in raw if isinstance(e, (Kernel, Memcpy, Memset)))
    union: list[list[int]] = []
    for s, e in ops:  # plain merge
        if union and s <= union[-1][1]:
            union[-1][1] = max(union[-1][1], e)
        else:
            union.append([s, e])
    first, last = ops[0][0], max(e for _, e in ops)
    gpu = [s for s in stats if isinstance(s, GpuStats)]
    assert gpu
    for g in gpu:
        lo, hi = g.interval_start, g.interval_end
        busy = sum(max(0, min(e, hi) - max(s, lo)) for s, e in union)
        traced = max(0, min(last, hi) - max(first, lo))  # no spans: first record to the last
        assert (g.busy_ns, g.traced_ns) == (busy, traced)
        # Traced throughout the time the program ran in the interval: measured, not estimated.
        assert not g.estimated and g.traced_fraction == traced / interval
        kernels = [e for e in raw if isinstance(e, Kernel) and lo <= e.end < hi]
        assert (g.kernels, g.kernel_ns) == (len(kernels), sum(e.end - e.start for e in kernels))
        copies = [e for e in raw if isinstance(e, Memcpy) and lo <= e.end < hi]
        assert (g.copies, g.copy_bytes) == (len(copies), sum(e.bytes for e in copies))
    # Every interval from the first record to the last is reported, idle ones with busy 0.
    assert [g.interval_start for g in gpu] == list(range(first // interval * interval, last, interval))


def test_the_name_cap_keeps_the_top_names_by_time_and_folds_the_rest_into_other() -> None:
    raw, full, _ = _decode("torch_train", 10 * SECOND)
    _, capped, _ = _decode("torch_train", 10 * SECOND, max_names=3)
    kernels = {s.name: s for s in full if isinstance(s, ActivityStats) and s.category == "kernel"}
    rows = {s.name: s for s in capped if isinstance(s, ActivityStats) and s.category == "kernel"}
    top = sorted(kernels.values(), key=lambda s: -s.total_ns)
    assert len(kernels) > 4 and set(rows) == {s.name for s in top[:3]} | {"other"}
    other = rows["other"]
    rest = top[3:]
    assert (other.count, other.total_ns) == (sum(s.count for s in rest), sum(s.total_ns for s in rest))
    merged: dict[int, int] = defaultdict(int)
    for s in rest:
        for index, c in _histogram_counts(s.durations).items():
            merged[index] += c
    assert _histogram_counts(other.durations) == dict(merged)
    assert other.durations.min == min(s.durations.min for s in rest) and not other.nccl
    assert sum(s.count for s in rows.values()) == sum(1 for e in raw if isinstance(e, Kernel))


def test_nccl_kernels_are_flagged_and_summed_per_device() -> None:
    cap = capture.read(CAPTURE_DIR / "torch_train.cupti")
    names = TableNames(cap.strings)
    decoder = Decoder(names, RecordLayouts(dict(cap.struct_sizes)))
    kernels = np.concatenate(
        [r for b in cap.buffers for _, e, r in decoder._records(b.data, len(b.data), None) if e == "kernel"]
    )
    # The capture has no NCCL: name every third kernel like NCCL's (case differs on purpose).
    renamed = kernels.copy()
    renamed["name"][::3] = 0x1000
    renamed["name"][1::3] = 0x2000
    table = TableNames({**cap.strings, 0x1000: "ncclDevKernel_AllReduce_Sum_f32", 0x2000: "NCCLKernel_x"})
    acc = Accumulator(10 * SECOND, 500, table)
    acc.add("kernel", renamed)
    acc.buffer_done()
    out = acc.close()
    durations = (renamed["end"] - renamed["start"]).astype(np.int64)
    nccl = int(durations[0::3].sum() + durations[1::3].sum())
    gpu = [g for g in out if isinstance(g, GpuStats)]
    assert sum(g.nccl_ns for g in gpu) == nccl and sum(g.kernel_ns for g in gpu) == int(durations.sum())
    flagged = {s.name for s in out if isinstance(s, ActivityStats) and s.nccl}
    assert flagged == {"ncclDevKernel_AllReduce_Sum_f32", "NCCLKernel_x"}


def _arrays(name: str) -> tuple[list[tuple[str, np.ndarray]], TableNames]:
    return arrays_of(CAPTURE_DIR / f"{name}.cupti")


def arrays_of(path: Path) -> tuple[list[tuple[str, np.ndarray]], TableNames]:
    """The kernel, memcpy and memset record arrays of a capture file, and its names."""
    cap = capture.read(path)
    names = TableNames(cap.strings)
    decoder = Decoder(names, RecordLayouts(dict(cap.struct_sizes)))
    arrays = [(e, r) for b in cap.buffers for _, e, r in decoder._records(b.data, len(b.data), None)]
    return [(e, r) for e, r in arrays if e in ("kernel", "memcpy", "memset")], names


def _shifted(records: np.ndarray, to: int) -> np.ndarray:
    """The records moved so that the first starts at ``to`` (their spacing kept)."""
    out = records.copy()
    base = int(records["start"].min())
    for field in ("start", "end"):
        out[field] = (out[field].astype(np.int64) - base + to).astype(out[field].dtype)
    return out


def test_spans_set_coverage_and_estimates_scale_to_the_interval() -> None:
    arrays, names = _arrays("exact_counts")
    kernels = next(r for e, r in arrays if e == "kernel")
    t0 = 1000 * 10 * SECOND
    moved = _shifted(kernels, t0 + 2 * SECOND)
    span = int(moved["end"].max()) - (t0 + 2 * SECOND)
    acc = Accumulator(10 * SECOND, 500, names)
    assert acc.span(1, t0 + 2 * SECOND, 0, ["concurrent_kernel"]) == []  # opens; nothing to close
    acc.add("kernel", moved)
    acc.buffer_done()
    acc.span(1, t0 + 2 * SECOND, t0 + 2 * SECOND + span, ["concurrent_kernel"])
    acc.span(2, t0 + 6 * SECOND, t0 + 7 * SECOND, ["concurrent_kernel"])  # a second window, nothing in it
    out = acc.close()
    rows = [s for s in out if isinstance(s, ActivityStats)]
    traced = span + SECOND
    observed = 5 * SECOND  # from the first window's start to the second's end: the program's time
    assert rows and all(s.traced_ns == traced and s.estimated for s in rows)
    for s in rows:
        assert s.estimated_count == round(s.count * observed / traced)
        assert s.estimated_total_ns == round(s.total_ns * observed / traced)
    (gpu,) = [g for g in out if isinstance(g, GpuStats)]
    assert gpu.traced_ns == traced and gpu.traced_fraction == traced / (10 * SECOND) and gpu.estimated
    assert gpu.busy_fraction == gpu.busy_ns / traced


def test_kernels_in_flight_at_a_window_close_end_at_the_close() -> None:
    """CUPTI dates a kernel still running at a forced flush with the flush's time (a CUDA graph's
    kernels: ~0.1 s late). Between the closing notice and the close, kernels end at the notice's
    time at the latest; those that ended before, and a later window's, keep their times."""
    arrays, names = _arrays("exact_counts")
    kernels = next(r for e, r in arrays if e == "kernel")
    t0 = 1000 * 10 * SECOND
    moved = _shifted(kernels, t0 + SECOND)
    start, end = moved["start"].astype(np.int64), moved["end"].astype(np.int64)
    k = int(np.argmax(end - start))
    close = int(start[k] + end[k]) // 2  # inside the longest kernel
    late = moved.copy()
    in_flight = (start < close) & (end > close)
    late["end"][in_flight] = late["end"][in_flight] + 120_000_000  # dated at the flush, 120 ms on
    acc = Accumulator(10 * SECOND, 500, names)
    acc.span(1, t0 + SECOND, 0, ["concurrent_kernel"])
    acc.window_closing(close)
    acc.add("kernel", late)
    acc.buffer_done()
    acc.span(1, t0 + SECOND, close, ["concurrent_kernel"])
    after = _shifted(kernels, close + SECOND)  # the next window: no close pending
    acc.span(2, close + SECOND, 0, ["concurrent_kernel"])
    acc.add("kernel", after)
    acc.buffer_done()
    acc.span(2, close + SECOND, int(after["end"].max()), ["concurrent_kernel"])
    out = acc.close()
    expected = int((np.minimum(end, np.maximum(start, close)) - start)[start < close].sum())
    expected += int((end - start)[start >= close].sum())
    next_window = int((after["end"].astype(np.int64) - after["start"].astype(np.int64)).sum())
    expected += next_window
    unclipped = int((late["end"].astype(np.int64) - start).sum()) + next_window
    kernel_ns = sum(s.total_ns for s in out if isinstance(s, ActivityStats) and s.category == "kernel")
    assert acc.ended_at_close == int(in_flight.sum()) >= 1
    assert kernel_ns == expected < unclipped


def test_kernels_of_a_closed_window_that_come_back_later_end_at_its_close() -> None:
    """A buffer decoded after the window's close (no closing notice pending any more) holds kernels
    that started inside it and are dated at a later flush: they end at the close too, and kernels
    of no window keep their times."""
    arrays, names = _arrays("exact_counts")
    kernels = next(r for e, r in arrays if e == "kernel")
    t0 = 1000 * 10 * SECOND
    moved = _shifted(kernels, t0 + SECOND)
    start, end = moved["start"].astype(np.int64), moved["end"].astype(np.int64)
    close = int(np.median(start))
    late = moved.copy()
    inside = start < close
    late["end"][inside] = np.maximum(end[inside], close) + 120_000_000  # dated at a later flush
    acc = Accumulator(10 * SECOND, 500, names)
    acc.span(1, t0, 0, ["concurrent_kernel"])
    acc.span(1, t0, close, ["concurrent_kernel"])  # closed before its last buffer came
    acc.add("kernel", late)
    acc.buffer_done()
    out = acc.close()
    kernel_ns = sum(s.total_ns for s in out if isinstance(s, ActivityStats) and s.category == "kernel")
    expected = int((close - start)[inside].sum() + (end - start)[~inside].sum())
    assert acc.ended_at_close == int(inside.sum()) >= 1
    assert kernel_ns == expected


def test_a_closing_notice_reaches_the_statistics_and_is_no_close() -> None:
    stream, _, _ = _stream("exact_counts")
    assert stream.trace_span(TraceSpan(stream=3, window=1, start=1)) is None
    assert stream.trace_span(TraceSpan(stream=3, window=1, start=1, end=5, closing=True)) is None
    assert stream.statistics is not None and stream.statistics._kernels_end_by == 5
    assert stream.open_spans == [TraceSpan(stream=3, window=1, start=1)]  # still open
    reply = stream.trace_span(TraceSpan(stream=3, window=1, start=1, end=6))
    assert reply is not None and stream.statistics._kernels_end_by == 0 and stream.open_spans == []
    stream.close()


def test_records_outside_their_categorys_spans_are_counted_not_estimated() -> None:
    arrays, names = _arrays("exact_counts")
    acc = Accumulator(10 * SECOND, 500, names)
    first = min(int(r["start"].min()) for _, r in arrays)
    acc.span(1, first, 0, ["concurrent_kernel"])  # copies are not traced in this window
    for event, records in arrays:
        acc.add(event, records)
    acc.buffer_done()
    out = acc.close()
    assert {s.category for s in out if isinstance(s, ActivityStats)} == {"kernel"}
    assert acc.untraced_records == sum(len(r) for e, r in arrays if e == "memcpy") > 0


def test_intervals_close_after_the_lateness_margin_and_late_records_are_counted() -> None:
    arrays, names = _arrays("torch_train")
    kernels = next(r for e, r in arrays if e == "kernel")
    t0 = 500 * 10 * SECOND
    acc = Accumulator(10 * SECOND, 500, names)
    acc.add("kernel", _shifted(kernels, t0 + SECOND))
    assert acc.buffer_done() == []
    # Time moves to just before the end of the interval plus the margin: still open.
    acc.add("kernel", _shifted(kernels[:1], t0 + 10 * SECOND + LATENESS_NS - SECOND))
    assert acc.buffer_done() == []
    acc.add("kernel", _shifted(kernels[:1], t0 + 10 * SECOND + LATENESS_NS + 1))
    closed = acc.buffer_done()
    assert {e.interval_start for e in closed} == {t0}  # type: ignore[attr-defined]
    assert sum(s.count for s in closed if isinstance(s, ActivityStats)) == len(kernels)
    acc.add("kernel", _shifted(kernels[:5], t0 + 2 * SECOND))  # for the closed interval
    assert acc.buffer_done() == [] and acc.late_records == 5
    rest = acc.close()
    assert {e.interval_start for e in rest} == {t0 + 10 * SECOND}  # type: ignore[attr-defined]
    assert sum(s.count for s in rest if isinstance(s, ActivityStats)) == 2


def test_histograms_wider_than_160_buckets_are_downscaled() -> None:
    dense = np.zeros(DENSE, np.int64)
    values = [1, 3, 1000, 2**20 + 5, 2**45, 2**50]  # 2**-0.25 .. 2**50: 205 buckets at scale 2
    slot = {v: _bucket(v) - LOWEST + 1 for v in values}
    for v in values:
        dense[slot[v]] += 1
    h = to_histogram(dense, 1, 2**50)
    assert h.scale == 1 and len(h.counts) <= MAX_BUCKETS and sum(h.counts) == len(values)
    base = 2 ** (2**-h.scale)
    for v in values:  # each value sits in its bucket at the new scale
        index = next(
            h.offset + k
            for k, c in enumerate(h.counts)
            if c and base ** (h.offset + k) < v <= base ** (h.offset + k + 1)
        )
        assert index is not None


# --- the collector's decode stream ---------------------------------------------------------------


def _stream(name: str, records: str = "all") -> tuple[DecodeStream, Collect, capture.Capture]:
    cap = capture.read(CAPTURE_DIR / f"{name}.cupti")
    info = OpenStream(
        stream=3, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings),
        records=records,
    )  # fmt: skip
    sink = Collect()
    return DecodeStream(info, 0, sink, statistics=StatisticsConfig()), sink, cap


def _feed(stream: DecodeStream, cap: capture.Capture) -> None:
    for buf in cap.buffers:
        data = bytearray(buf.data)
        stream.decode(memoryview(data), len(data), 0)


def test_a_closed_window_reports_what_was_decoded_in_it() -> None:
    stream, sink, cap = _stream("torch_train")
    start = 1
    assert stream.trace_span(TraceSpan(stream=3, window=7, start=start)) is None
    _feed(stream, cap)
    reply = stream.trace_span(TraceSpan(stream=3, window=7, start=start, end=start + 1))
    assert reply is not None and (reply.stream, reply.window) == (3, 7)
    raw = [e for e in sink.events if not isinstance(e, (ActivityStats, GpuStats))]
    counted: dict[str, int] = defaultdict(int)
    for e in raw:
        counted[type(e).__struct_config__.tag] += 1  # type: ignore[attr-defined]
    counted["nvtx_range"] = reply.records["nvtx_range"]  # START/END records pair into fewer events
    assert reply.records == dict(counted)
    assert reply.kernel_ns == sum(e.end - e.start for e in raw if isinstance(e, Kernel)) > 0
    stream.close()


def test_on_demand_records_only_inside_on_demand_windows_statistics_from_all() -> None:
    stream, sink, cap = _stream("exact_counts", records="on_demand")
    _feed(stream, cap)  # outside any window: statistics only
    assert not any(isinstance(e, Kernel) for e in sink.events)
    assert stream.records_withheld == stream.records > 0
    stream.trace_span(TraceSpan(stream=3, window=1, start=1, on_demand=True))
    _feed(stream, cap)
    stream.trace_span(TraceSpan(stream=3, window=1, start=1, end=2, on_demand=True))
    kernels = sum(1 for e in sink.events if isinstance(e, Kernel))
    stream.close()
    stats = [e for e in sink.events if isinstance(e, ActivityStats) and e.category == "kernel"]
    assert kernels == 560 and stream.records_withheld == stream.records // 2
    assert sum(s.count for s in stats) == 2 * 560  # both passes are in the statistics
    assert not sink.losses


def test_statistics_off_emit_nothing() -> None:
    cap = capture.read(CAPTURE_DIR / "exact_counts.cupti")
    info = OpenStream(
        stream=0, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings)
    )
    sink = Collect()
    stream = DecodeStream(info, 0, sink, statistics=StatisticsConfig(enabled=False))
    _feed(stream, cap)
    stream.close()
    assert sink.events and not any(isinstance(e, (ActivityStats, GpuStats)) for e in sink.events)


def test_names_past_the_tables_bound_fold_into_other_as_they_come() -> None:
    arrays, _ = _arrays("torch_train")
    kernels = np.tile(next(r for e, r in arrays if e == "kernel"), 30)
    kernels["name"] = np.arange(len(kernels)) % 1500 + 1  # 1500 distinct names, more than 1024 kept
    table = TableNames({i + 1: f"k{i}" for i in range(1500)})
    acc = Accumulator(10 * SECOND, 10, table)
    half = len(kernels) // 2
    for part in (kernels[:half], kernels[half:]):  # the second part meets a full table
        acc.add("kernel", part)
        acc.buffer_done()
    rows = [s for s in acc.close() if isinstance(s, ActivityStats)]
    durations = (kernels["end"] - kernels["start"]).astype(np.int64)
    assert len(rows) == 11 and rows[-1].name == "other"
    assert sum(s.count for s in rows) == len(kernels) and sum(s.total_ns for s in rows) == int(
        durations.sum()
    )
    assert sum(sum(s.durations.counts) for s in rows) == len(kernels)
    assert rows[0].total_ns >= rows[9].total_ns


def test_a_failure_in_the_statistics_turns_them_off_and_keeps_the_raw_events() -> None:
    stream, sink, cap = _stream("exact_counts")
    # A kernel layout without the fields the statistics read (no device_id): they stop, once.
    odd = np.zeros(3, dtype=[("start", "<u8"), ("end", "<u8"), ("name", "<u8")])
    odd["start"], odd["end"] = 10, 20
    stream._observe(10, "kernel", odd)
    assert stream.statistics is None and len(sink.errors) == 1 and "statistics stopped" in sink.errors[0][1]
    _feed(stream, cap)
    stream.close()
    assert sum(1 for e in sink.events if isinstance(e, Kernel)) == 560
    assert not any(isinstance(e, (ActivityStats, GpuStats)) for e in sink.events) and len(sink.errors) == 1


def test_launch_rate_compares_the_calls_of_whole_cycles_with_the_calls_inside_windows() -> None:
    """Two 100 ms windows 5 s apart: 2,900 calls in each (29k/s), 155,000 ids in the gap between them,
    as W2 on the H100 (a launch-bound program launches more slowly while it is traced)."""
    rate = LaunchRate()
    t0 = 1000 * SECOND
    starts = t0 + 1000 + np.arange(2900, dtype=np.int64) * (100_000_000 // 2900)
    second = 2900 + 155_000
    for window, at, first in ((1, t0, 1), (2, t0 + 5 * SECOND, second)):
        rate.span(window, at, 0)
        rate.add(starts + (at - t0), np.arange(first, first + 2900, dtype=np.int64))
        rate.span(window, at, at + 100_000_000)
    inside = 2 * 2900 / (2 * 100_000_000)
    overall = (second - 1) / (5 * SECOND)
    assert rate.correction(t0, t0 + 10 * SECOND) == pytest.approx(overall / inside)
    assert rate.correction(t0 + 10 * SECOND, t0 + 20 * SECOND) == 1.0  # no window opened there
    assert LaunchRate().correction(0, t0) == 1.0
    one = LaunchRate()
    one.span(1, t0, t0 + 100_000_000)
    one.add(starts, np.arange(1, 2901, dtype=np.int64))
    assert one.correction(t0, t0 + 10 * SECOND) == 1.0  # one window: no cycle to measure


def test_a_window_after_a_detached_gap_starts_no_cycle() -> None:
    """``between_windows: detach``: CUPTI numbered no call between the windows, so the ids of a
    window attached afresh say nothing about the gap; only cycles into windows that found CUPTI
    attached are measured, and with none the counts are scaled by time alone."""
    t0 = 1000 * SECOND
    starts = t0 + 1000 + np.arange(2900, dtype=np.int64) * (100_000_000 // 2900)

    def windows(fresh: list[bool], gap_ids: int) -> LaunchRate:
        rate = LaunchRate()
        first = 1 - 2900
        for window, is_fresh in enumerate(fresh, start=1):
            first += 2900 + (0 if is_fresh else gap_ids)  # the gap before it was numbered only if attached
            at = t0 + (window - 1) * 5 * SECOND
            rate.span(window, at, 0, is_fresh)
            rate.add(starts + (at - t0), np.arange(first, first + 2900, dtype=np.int64))
            rate.span(window, at, at + 100_000_000)
        return rate

    # Every gap detached: ids run on from window to window as if no call was made between them.
    assert windows([True, True, True], gap_ids=155_000).correction(t0, t0 + 20 * SECOND) == 1.0
    # One gap attached (window 3 found CUPTI attached): that cycle alone gives the call rate.
    mixed = windows([True, True, False], gap_ids=155_000)
    inside = 3 * 2900 / (3 * 100_000_000)
    assert mixed.correction(t0, t0 + 20 * SECOND) == pytest.approx(((2900 + 155_000) / (5 * SECOND)) / inside)


def _bursty_program(seed: int) -> tuple[LaunchRate, LaunchRate]:
    """A program held to a rate: a 50 ms burst of calls every 80 ms (one every 20 us), then a wait;
    150 ms windows at random phases, one every 1-3 s, for 120 s. It calls at the same rate traced or
    not, so the true correction is 1. Returns the windows seen as their spans, and as the spans of
    their records alone (the spans that read a waiting program's rate low)."""
    rng = np.random.default_rng(seed)
    t0 = 1000 * SECOND
    period, burst, gap = 80_000_000, 50_000_000, 20_000
    per_burst = burst // gap
    by_span, by_records = LaunchRate(), LaunchRate()
    at, window = t0 + int(rng.integers(0, period)), 0
    while at < t0 + 120 * SECOND:
        window += 1
        end = at + 150_000_000
        k = np.arange((at - t0) // period, (end - t0) // period + 1)
        calls = (t0 + k[:, None] * period + np.arange(per_burst) * gap).ravel()
        ids = (k[:, None] * per_burst + np.arange(per_burst) + 1).ravel()
        inside = (calls >= at) & (calls < end)
        starts, corr = calls[inside] + 10_000, ids[inside]  # GPU start 10 us after the call
        by_span.span(window, at, 0)
        by_span.add(starts, corr)
        by_span.span(window, at, end)
        by_records.span(window, int(starts.min()), 0)  # the window as its records show it
        by_records.add(starts, corr)
        by_records.span(window, int(starts.min()), int(starts.max()))
        at = end + int(rng.uniform(1, 3) * SECOND)
    return by_span, by_records


def test_a_program_that_waits_between_bursts_is_counted_by_its_windows_spans() -> None:
    """W2 and W4 held to a fixed rate read about 7.5 % too few kernels per iteration when the rate
    inside a window comes from its records' span: a window that opens or closes in
    a wait has records over part of it only. Over the window's own span the correction is 1."""
    for seed in range(3):
        by_span, by_records = _bursty_program(seed)
        t0 = 1000 * SECOND
        assert by_span.correction(t0, t0 + 130 * SECOND) == pytest.approx(1.0, abs=0.02)
        assert by_records.correction(t0, t0 + 130 * SECOND) < 0.975  # the records' spans read low


def test_estimated_counts_scale_the_untraced_time_at_the_rate_between_windows() -> None:
    arrays, names = _arrays("exact_counts")
    kernels = next(r for e, r in arrays if e == "kernel")
    t0 = 1000 * 10 * SECOND
    first, second = _shifted(kernels, t0 + SECOND), _shifted(kernels, t0 + 6 * SECOND)
    ids = np.arange(1, len(kernels) + 1, dtype=np.int64)
    first["correlation_id"] = ids
    gap_ids = 40 * len(kernels)  # far more calls between the windows than their time alone implies
    second["correlation_id"] = ids + len(kernels) + gap_ids
    span = int(first["end"].max()) - (t0 + SECOND)
    acc = Accumulator(10 * SECOND, 500, names)
    for window, records, at in ((1, first, t0 + SECOND), (2, second, t0 + 6 * SECOND)):
        acc.span(window, at, 0, ["concurrent_kernel"])
        acc.add("kernel", records)
        acc.buffer_done()
        acc.span(window, at, at + span, ["concurrent_kernel"])
    correction = acc.launches.correction(t0, t0 + 10 * SECOND)
    assert correction > 1.5
    out = acc.close()
    rows = [s for s in out if isinstance(s, ActivityStats) and s.category == "kernel"]
    traced, observed = 2 * span, 5 * SECOND + span
    for s in rows:
        assert s.estimated_count == round(s.count * correction * observed / traced)
        assert s.estimated_total_ns == round(s.total_ns * observed / traced)  # time scales by time


def test_nccl_names_are_never_folded_into_other() -> None:
    """1,170 kernel names at a cap of 10 (1,024 rows kept while accumulating), four NCCL ones coming
    last: each NCCL name keeps its own row, flagged, and GpuStats' NCCL time is theirs."""
    arrays, _ = _arrays("torch_train")
    kernels = np.tile(next(r for e, r in arrays if e == "kernel"), 30)
    n = len(kernels)
    assert n > 1100
    kernels["name"] = np.arange(n) + 1  # one name per kernel, in launch order
    names = {i + 1: f"k{i}" for i in range(n - 4)} | {n - 3 + i: f"ncclDevKernel_{i}" for i in range(4)}
    acc = Accumulator(10 * SECOND, 10, TableNames(names))
    half = len(kernels) // 2
    for part in (kernels[:half], kernels[half:]):
        acc.add("kernel", part)
        acc.buffer_done()
    out = acc.close()
    rows = [s for s in out if isinstance(s, ActivityStats)]
    nccl = {s.name: s for s in rows if s.nccl}
    assert sorted(nccl) == [f"ncclDevKernel_{i}" for i in range(4)]
    durations = (kernels["end"] - kernels["start"]).astype(np.int64)
    is_nccl = kernels["name"] > n - 4
    assert sum(s.total_ns for s in nccl.values()) == int(durations[is_nccl].sum()) > 0
    assert sum(g.nccl_ns for g in out if isinstance(g, GpuStats)) == int(durations[is_nccl].sum())
    assert sum(s.count for s in rows) == len(kernels)


def test_a_window_with_few_calls_gives_no_launch_rate() -> None:
    rate = LaunchRate()
    t0 = 1000 * SECOND
    for window, at, ids in ((1, t0, [1, 3]), (2, t0 + 5 * SECOND, [90_000, 90_002])):
        rate.span(window, at, 0)
        rate.add(np.array([at + 10, at + 1000]), np.array(ids))  # 2 records: no rate worth dividing by
        rate.span(window, at, at + 100_000_000)
    assert rate.correction(t0, t0 + 10 * SECOND) == 1.0


def test_busy_segments_held_stay_bounded_when_the_clock_stands_still(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay of the same buffers never moves the newest time on, so nothing settles by the
    lateness margin: the segments held stop at ``PENDING_MAX`` and the busy union still counts
    each instant once (here every buffer covers the same 4 segments)."""
    from cuptistream.statistics import busy as busy_module

    monkeypatch.setattr(busy_module, "PENDING_MAX", 100)
    device = busy_module.DeviceBusy(interval_ns=1_000)
    starts = np.array([10, 30, 50, 70], dtype=np.int64)
    ends = starts + 5
    for _ in range(1000):  # the same buffer again and again
        device.add(starts, ends)
        assert device.pending_segments <= 100
    device.settle(10_000)
    assert device.take(0) == 20  # 4 segments of 5 ns, each counted once
