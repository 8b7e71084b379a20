"""GPU time by launching stack from the collector (``StackStats``), on the GPU recording with stacks
on (``tests/fixtures/stacks``) replayed through a decode stream as the probe's buffers and stack
chunks (``tests/helpers/stack_buffers.py``): the same per-stack GPU time as the join of the raw
records, the top stacks plus ``other`` adding up, estimates scaled as ``ActivityStats``' are, and
``flame``/``summary`` on a recording of the statistics alone ranking the code as on the raw one."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import msgspec
import numpy as np
import pytest

from cuptistream.analysis.sources import open_recordings
from cuptistream.analysis.stacks import index_stacks, join_stacks
from cuptistream.channel.messages import OpenStream, TraceSpan
from cuptistream.cli import main
from cuptistream.collector.decoding import DecodeStream, has_stack_events
from cuptistream.config.model import StatisticsConfig
from cuptistream.events import ActivityStats, ApiCall, Event, GpuStats, Kernel, Memcpy, Memset, StackStats
from cuptistream.stacks.index import NO_PYTHON_ID, OTHER_STACK, StackIndex
from tests.gpu.workloads.collect import Collect
from tests.helpers.fixture_recording import Process, write_recording
from tests.helpers.stack_buffers import CAPTURE, STRUCT_SIZES, Replay

INTERVAL_NS = 100_000_000
RAW = (Kernel, Memcpy, Memset, ApiCall)
KINDS = ["concurrent_kernel", "memcpy", "memset", "runtime", "driver"]


@cache
def _replay() -> Replay:
    return Replay()


def _run(max_stacks: int = 10_000, spans: bool = False) -> list[Event]:
    """The replay through a decode stream (statistics only, as ``records: on_demand`` outside
    windows); ``spans``: traced in one window, then a presence span that traces nothing until the
    end of the last interval (budget mode's shape)."""
    replay = _replay()
    info = OpenStream(
        stream=1,
        source="activity",
        struct_sizes=STRUCT_SIZES,
        strings=replay.strings,
        records="on_demand",
        stacks=True,
    )
    sink = Collect()
    config = StatisticsConfig(interval=INTERVAL_NS / 1e9, max_stacks=max_stacks)
    stream = DecodeStream(info, replay.pid, sink, statistics=config)
    first, last = _bounds()
    if spans:
        stream.trace_span(TraceSpan(stream=1, window=1, start=first, kinds=KINDS))
    for step in replay:
        if step.buffer:
            data = bytearray(step.buffer)
            stream.decode(memoryview(data), len(data), 0)
        for chunk in step.stacks:
            assert has_stack_events(chunk.payload)
            stream.stack_events(chunk.payload, chunk.count)
    if spans:
        stream.trace_span(TraceSpan(stream=1, window=1, start=first, end=last, kinds=KINDS))
        end = (last // INTERVAL_NS + 1) * INTERVAL_NS - 1
        stream.trace_span(TraceSpan(stream=1, window=2, start=last + 1, kinds=[]))
        stream.trace_span(TraceSpan(stream=1, window=2, start=last + 1, end=end, kinds=[]))
    stream.close()
    assert not sink.errors, sink.errors
    return sink.events


@cache
def _bounds() -> tuple[int, int]:
    work = [e for b in _replay().batches for e in b.events if isinstance(e, Kernel | Memcpy | Memset)]
    return min(e.start for e in work), max(e.end for e in work)


@cache
def _full() -> tuple[StackStats, ...]:
    return tuple(e for e in _run() if isinstance(e, StackStats))


@cache
def _index() -> StackIndex:
    return index_stacks(open_recordings([str(CAPTURE)]))


def _by_frames(rows: Iterator[tuple[int, int]]) -> dict[tuple[str, ...], int]:
    """GPU ns per stack, keyed by its frames' labels (the ids are the process's own)."""
    replay = _replay()
    out: dict[tuple[str, ...], int] = defaultdict(int)
    for stack, ns in rows:
        frames = _index().frames_of((replay.resource.host, replay.pid), stack)
        out[tuple(f.label() for f in frames)] += ns
    return dict(out)


def test_the_collectors_stack_stats_equal_the_join_of_the_raw_records() -> None:
    stats = _full()
    assert stats and all(not s.estimated and s.process_id == _replay().pid for s in stats)
    assert len({(s.interval_start, s.device_id) for s in stats}) == len(stats) > 5  # one per interval
    collected = _by_frames((i, ns) for s in stats for i, ns in zip(s.stack_ids, s.gpu_ns, strict=True))
    raw: dict[tuple[str, ...], int] = defaultdict(int)
    for row in join_stacks(open_recordings([str(CAPTURE)])).result():
        raw[tuple(f.label() for f in row.frames)] += row.gpu_ns
    assert collected == dict(raw)
    assert len(collected) > 5 and min(collected.values()) > 0
    # Every GPU record of the capture is in them, once: as much as the ActivityStats beside them.
    activity = sum(e.total_ns for e in _run() if isinstance(e, ActivityStats))
    assert sum(sum(s.gpu_ns) for s in stats) == activity == sum(raw.values())


def test_the_top_stacks_and_other_add_up_to_every_stack() -> None:
    whole = {(s.interval_start, s.device_id): s for s in _full()}
    cut = [s for s in _run(max_stacks=3) if isinstance(s, StackStats)]
    folded = 0
    for s in cut:
        full = whole[(s.interval_start, s.device_id)]
        assert sum(s.gpu_ns) == sum(full.gpu_ns) and sum(s.launches) == sum(full.launches)
        assert s.stack_ids[:3] == full.stack_ids[:3] and s.gpu_ns[:3] == full.gpu_ns[:3]
        assert s.gpu_ns[:3] == sorted(s.gpu_ns[:3], reverse=True)
        if len(full.stack_ids) > 3:
            assert len(s.stack_ids) == 4 and s.stack_ids[3] == OTHER_STACK
            assert s.gpu_ns[3] == sum(full.gpu_ns[3:])
            folded += 1
        else:
            assert s.stack_ids == full.stack_ids
    assert folded >= 1


def test_estimates_scale_by_the_kernel_coverage_as_activity_stats_do() -> None:
    events = _run(spans=True)
    stats = [e for e in events if isinstance(e, StackStats)]
    gpu = {(e.interval_start, e.device_id): e for e in events if isinstance(e, GpuStats)}
    _, last = _bounds()
    estimated = [s for s in stats if s.estimated]
    assert len(estimated) == 1 and not all(s.estimated for s in stats)
    for s in stats:  # the kernels' traced time (GpuStats carries it too)
        assert (s.traced_ns, s.estimated) == (
            gpu[(s.interval_start, s.device_id)].traced_ns,
            gpu[(s.interval_start, s.device_id)].estimated,
        )
    (s,) = estimated
    (activity, *_) = sorted(
        (
            e
            for e in events
            if isinstance(e, ActivityStats)
            and e.category == "kernel"
            and e.interval_start == s.interval_start
        ),
        key=lambda e: -e.total_ns,
    )
    observed = s.interval_end - 1 - s.interval_start  # to the presence span's end
    assert s.traced_ns == last - s.interval_start < observed
    scale = observed / s.traced_ns
    assert s.estimated_gpu_ns == [round(ns * scale) for ns in s.gpu_ns]
    assert s.estimated_launches == [round(n * scale) for n in s.launches]
    assert activity.estimated_total_ns == round(activity.total_ns * scale)  # the same scale


@pytest.mark.parametrize("sampled", [True, False], ids=["stacks on, no event came", "stacks off"])
def test_no_stack_events_no_stack_stats(sampled: bool) -> None:
    replay = _replay()
    info = OpenStream(
        stream=1, source="activity", struct_sizes=STRUCT_SIZES, strings=replay.strings, stacks=sampled
    )
    sink = Collect()
    stream = DecodeStream(info, replay.pid, sink, statistics=StatisticsConfig(interval=0.1))
    for step in replay:
        if step.buffer:
            data = bytearray(step.buffer)
            stream.decode(memoryview(data), len(data), 0)
    assert stream.statistics is not None
    assert (stream.statistics.stacks is not None) == sampled  # a stream without stacks keeps nothing for them
    stream.close()
    assert any(isinstance(e, ActivityStats) for e in sink.events)
    assert not any(isinstance(e, StackStats) for e in sink.events)


def test_the_array_lookup_answers_as_the_one_launch_lookup() -> None:
    index = _index()
    replay = _replay()
    key = (replay.resource.host, replay.pid)
    apis = [e for b in replay.batches for e in b.events if isinstance(e, ApiCall)]
    threads = np.array([a.thread_id for a in apis] + [0x5151], np.int64)
    times = np.array([a.start for a in apis] + [apis[0].start], np.int64)
    one = [index.stack_at(key, t, at) for t, at in zip(threads.tolist(), times.tolist(), strict=True)]
    assert index.stacks_at(key, threads, times).tolist() == one
    assert one[-1] == NO_PYTHON_ID and len(set(one)) > 5


# --- the views on a recording of the statistics alone ------------------------------------------------


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The capture's process as it was (raw records), and as an always-on recording keeps it: its
    stack events and statistics, the collector's StackStats, no raw records."""
    replay = _replay()
    kept = [e for b in replay.batches for e in b.events if not isinstance(e, RAW)]
    clock = replay.batches[0].clock
    folder = tmp_path_factory.mktemp("views")
    raw = write_recording(
        folder / "raw", [Process(replay.resource, clock, [e for b in replay.batches for e in b.events])]
    )
    stats = write_recording(folder / "stats", [Process(replay.resource, clock, kept + list(_full()))])
    return raw, stats


def _speedscope(
    path: Path, out: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[tuple[str, ...], int], str]:
    assert main(["flame", str(path), "-o", str(out)]) == 0
    said = capsys.readouterr().err
    document = json.loads(out.read_text())
    frames = document["shared"]["frames"]
    (profile,) = document["profiles"]
    by_stack: dict[tuple[str, ...], int] = defaultdict(int)
    for sample, weight in zip(profile["samples"], profile["weights"], strict=True):
        by_stack[tuple(frames[i]["name"] for i in sample[:-1])] += weight  # without the GPU operation
    return dict(by_stack), said


def test_flame_ranks_the_stacks_alike_from_stack_stats(
    recordings: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw, stats = recordings
    from_raw, said_raw = _speedscope(raw, tmp_path / "raw.json", capsys)
    from_stats, said_stats = _speedscope(stats, tmp_path / "stats.json", capsys)
    assert from_stats == from_raw and len(from_raw) > 5
    assert sorted(from_stats, key=from_stats.__getitem__) == sorted(from_raw, key=from_raw.__getitem__)
    assert "stack_stats" in said_stats and "stack_stats" not in said_raw


def test_summary_ranks_the_code_alike_and_says_where_it_comes_from(
    recordings: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tables = {}
    for name, path in zip(("raw", "stats"), recordings, strict=True):
        assert main(["summary", str(path), "--format", "json"]) == 0
        report = json.loads(capsys.readouterr().out)
        tables[name] = report["code"]
    raw_rows, stats_rows = ([(r["code"], r["total_ns"]) for r in t["rows"]] for t in tables.values())
    assert stats_rows == raw_rows and len(raw_rows) > 3
    assert "stack_stats" in tables["stats"]["title"] and "stack_stats" not in tables["raw"]["title"]


def test_a_kernel_filter_on_stack_stats_is_refused_in_one_line(
    recordings: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["flame", str(recordings[1]), "-o", str(tmp_path / "x.pb.gz"), "--kernel", "nvjet"]) != 0
    said = capsys.readouterr().err.strip()
    assert "--kernel" in said and "leave out --kernel" in said and len(said.splitlines()) == 1


def test_a_decode_worker_takes_the_probes_stack_chunks() -> None:
    import socket

    from cuptistream.collector import worker_protocol as wp
    from cuptistream.collector.workers import Session

    replay = _replay()
    ours, theirs = socket.socketpair()
    session = Session(theirs)
    info = OpenStream(
        stream=1, source="activity", struct_sizes=STRUCT_SIZES, strings=replay.strings, stacks=True
    )
    opened = session.serve(wp.Open(info, replay.pid, True, INTERVAL_NS, 500, max_stacks=7), [])
    assert opened.problem is None
    chunk = next(c for step in replay for c in step.stacks)
    request = wp.Stacks(1, bytes(chunk.payload), chunk.count)
    ours.close()
    assert (
        session.serve(msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=wp.Request), []).problem
        is None
    )
    statistics = session.streams[1].statistics
    assert statistics is not None and statistics.stacks is not None
    assert statistics.stacks.saw_stacks and statistics.stacks.max_stacks == 7
    session.close()


def test_the_warehouse_query_gives_summarys_gpu_time_by_code(
    recordings: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipped gpu_time_by_code.sql on the always-on recording's jsonl rows, in ClickHouse."""
    from tests.helpers.clickhouse import Warehouse, recording_rows

    _, stats = recordings
    assert main(["summary", str(stats), "--format", "json", "--top", "1000"]) == 0
    summary = [(r["code"], r["total_ns"]) for r in json.loads(capsys.readouterr().out)["code"]["rows"]]
    warehouse = Warehouse()
    try:
        warehouse.insert(recording_rows([stats]))
        rows = warehouse.query("gpu_time_by_code", job="", since="2000-01-01 00:00:00",
                               until="2100-01-01 00:00:00", top=1000)  # fmt: skip
    finally:
        warehouse.close()
    assert [(r["code"], r["estimated_total_ns"]) for r in rows] == summary and len(summary) > 3
