"""Moving a probe connection's streams to another decode worker (``auto``: a busy worker splits;
``collector.handover``, ``WorkerPool.balance``), with real worker processes, memfd slots and the
shipped torch capture:

- a stream moved mid-run writes what it writes on one worker: events, statistics (an interval open
  across the move), an open trace window's counts, losses, counters;
- names read from the program's memory keep working after the move (the collector hands the new
  worker its own ``/proc/PID/mem``);
- a move the new worker cannot take (it was killed) keeps the stream whole, in the connection's
  thread, with one Error event and nothing lost;
- the pool splits a busy worker and picks the heavier half of its connections;
- a worker left without connections stops, unless it is the last one or connections move to it;
- end to end, a ``cuptistream run`` whose workers split writes exactly the events of in-thread
  decoding.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

import cuptistream
from cuptistream.channel.messages import OpenStream, TraceSpan
from cuptistream.channel.shm import SlotPool
from cuptistream.collector import handover, worker_pool
from cuptistream.collector.decoding import DecodeStream
from cuptistream.collector.remote_stream import RemoteStream
from cuptistream.collector.worker_pool import WorkerPool
from cuptistream.config.model import StatisticsConfig
from cuptistream.cupti import capture
from cuptistream.cupti.kinds import BY_VALUE
from cuptistream.cupti.records import RecordLayouts, walk
from cuptistream.events import Error, Kernel, Loss, SelfStats
from cuptistream.sources.replay import DEFAULT_PATH
from tests.gpu.workloads.collect import Collect
from tests.slot_buffers import remotely, through_slot

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
CAPTURE = capture.read(DEFAULT_PATH / "torch_train.cupti")
SPAN = {"stream": 3, "window": 1, "start": 1, "on_demand": False, "kinds": ["concurrent_kernel"]}


def _named_here(cap: capture.Capture) -> tuple[list[bytearray], dict[int, str], list[Any]]:
    """The capture's buffers with every kernel's name pointer moved to a string in this process
    (so a worker reads it through this process's ``/proc/PID/mem``, as from a real program), the
    names by their new address, and the strings (keep them alive)."""
    layouts = RecordLayouts(dict(cap.struct_sizes))
    buffers, kept, names = [], [], {}
    for buf in cap.buffers:
        data = bytearray(buf.data)
        for kind, offsets in walk(memoryview(data), len(data), layouts, None).items():
            chosen = layouts.dtype(kind)
            if BY_VALUE[kind].event != "kernel" or chosen is None:
                continue
            for offset in offsets:
                record = np.ndarray((1,), chosen[1], buffer=data, offset=offset)
                text = ctypes.create_string_buffer(cap.strings[int(record["name"][0])].encode())
                kept.append(text)
                record["name"][0] = ctypes.addressof(text)
                names[ctypes.addressof(text)] = text.value.decode()
        buffers.append(data)
    return buffers, names, kept


def _decode_all(
    workers: WorkerPool,
    pool: SlotPool,
    buffers: list[bytearray],
    move_at: int | None,
    kill_first: bool = False,
    from_thread: bool = False,
) -> tuple[Any, ...]:
    """One stream over ``buffers`` through a worker, moved to a second worker before buffer
    ``move_at`` (None: never); ``kill_first``: the second worker is killed before the move;
    ``from_thread``: decoded here (as on a connection's thread) until ``move_at``, then adopted
    by a worker. Everything the stream emitted, its trace window's counts, and its counters."""
    sink = Collect()
    info = OpenStream(stream=3, source="activity", struct_sizes=dict(CAPTURE.struct_sizes))  # names: ours
    statistics = StatisticsConfig(interval=1.0)  # type: ignore[arg-type]
    here: DecodeStream | None = None
    links = []
    if from_thread:
        here = DecodeStream(info, os.getpid(), sink, None, statistics)
        assert here.trace_span(TraceSpan(**SPAN)) is None  # open across the move
    else:
        links.append(workers.assign())
        assert links[0] is not None
        links[0].map_pool(0, pool)
        stream = RemoteStream(links[0], info, os.getpid(), sink, None, statistics)
        assert stream.trace_span(TraceSpan(**SPAN)) is None
    for i, data in enumerate(buffers):
        if here is not None and i < (move_at or 0):
            here.decode(memoryview(data), len(data), 0)
            continue
        if i == move_at:
            fresh = workers.assign()
            assert fresh is not None and all(fresh.worker is not link.worker for link in links)
            if kill_first:
                fresh.worker.kill()
                fresh.worker.process.wait()
            fresh.map_pool(0, pool)
            if here is not None:  # from the thread: its state, adopted
                state = handover.dump(here)
                here.names.close()  # type: ignore[union-attr]
                stream = RemoteStream(fresh, info, os.getpid(), sink, None, statistics, state=state)
            else:
                assert stream.movable
                stream.move(fresh)
            links.append(fresh)
        through_slot(pool, 3, data, remotely(stream))
    window = stream.trace_span(TraceSpan(**{**SPAN, "end": 2**62}))
    stream.close()
    for each in links:
        if each is not None:
            each.close()
    counts = (stream.buffers, stream.records, stream.records_withheld, stream.events)
    return sink.events, sink.losses, sink.errors, window, counts, stream.local is not None


@pytest.fixture
def buffers() -> Any:
    data, names, kept = _named_here(CAPTURE)
    yield data, names
    del kept


@pytest.fixture
def two_workers(buffers: Any) -> Any:
    """Two decode workers and a slot pool the buffers fit in; stopped and closed after the test."""
    workers = WorkerPool(2)
    pool = SlotPool.create("moves", max(map(len, buffers[0])) + 8, 2)
    yield workers, pool
    workers.stop()
    pool.close()


def test_a_moved_stream_writes_what_one_worker_writes(buffers: Any, two_workers: Any) -> None:
    data, names = buffers
    workers, pool = two_workers
    (events, losses, errors, window, counts, local) = _decode_all(workers, pool, data, None)
    moved = _decode_all(workers, pool, data, len(data) // 2)
    # Only the warning that other kinds' name pointers (left as captured) cannot be read, as in
    # the collector
    assert not local and all(e[2] == "warning" for e in errors), errors
    assert moved == (events, losses, errors, window, counts, False)
    assert window is not None and window.records["kernel"] > 0
    kinds = {type(e).__name__ for e in events}
    assert {"ActivityStats", "GpuStats"} <= kinds  # the statistics, an interval open across the move
    kernels = [e for e in moved[0] if isinstance(e, Kernel)]
    assert kernels and {k.name for k in kernels} <= set(names.values())  # read after the move too
    assert workers.started == 2 and workers.died == 0


def test_a_stream_decoded_on_its_thread_then_adopted_by_a_worker_writes_the_same(
    buffers: Any, two_workers: Any
) -> None:
    workers, pool = two_workers
    reference = _decode_all(workers, pool, buffers[0], None)
    adopted = _decode_all(workers, pool, buffers[0], len(buffers[0]) // 3, from_thread=True)
    assert adopted == reference and not adopted[5]


def test_a_window_open_when_a_thread_stream_moved_outlives_that_workers_death(
    buffers: Any, two_workers: Any
) -> None:
    """The window opened while the stream decoded on its thread is reopened in the thread when
    the worker that adopted the stream dies, so its close still counts what came after."""
    data, _ = buffers
    workers, pool = two_workers
    sink = Collect()
    info = OpenStream(stream=3, source="activity", struct_sizes=dict(CAPTURE.struct_sizes))
    statistics = StatisticsConfig(interval=1.0)  # type: ignore[arg-type]
    here = DecodeStream(info, os.getpid(), sink, None, statistics)
    here.trace_span(TraceSpan(**SPAN))
    here.decode(memoryview(data[0]), len(data[0]), 0)
    link = workers.assign()
    assert link is not None
    link.map_pool(0, pool)
    state = handover.dump(here)
    here.names.close()  # type: ignore[union-attr]
    stream = RemoteStream(
        link, info, os.getpid(), sink, None, statistics, state=state, open_spans=here.open_spans
    )
    assert stream.local is None and here.open_spans
    link.worker.kill()
    link.worker.process.wait()
    for buffer in data[1:]:
        through_slot(pool, 3, buffer, remotely(stream))
    window = stream.trace_span(TraceSpan(**{**SPAN, "end": 2**62}))
    stream.close()
    link.close()
    assert stream.local is not None  # decoded in the thread after the worker died
    assert window is not None and window.records.get("kernel", 0) > 0, window


def _until_ready(worker: Any) -> None:
    ends = time.monotonic() + 60
    while not worker.ready():
        assert time.monotonic() < ends, "the worker never said it started up"
        time.sleep(0.02)


def test_a_thread_connection_moves_to_a_worker_once_another_comes_and_that_worker_is_up() -> None:
    workers = WorkerPool(2, in_thread=1, per_worker=8)
    try:
        assert workers.assign() is None and not workers.threads_should_move  # alone: its thread
        second = workers.assign()
        assert second is not None and workers.threads_should_move and workers.started == 1
        # Stopped before it could import anything: not up, so the thread connection stays for now
        # (moving would leave its probe's buffers undrained while the worker starts)
        os.kill(second.worker.pid, signal.SIGSTOP)
        assert not second.worker.ready() and workers.from_thread() is None
        assert workers.threads_should_move  # still told to move
        os.kill(second.worker.pid, signal.SIGCONT)
        _until_ready(second.worker)
        moved = workers.from_thread()
        assert moved is not None and moved.worker is second.worker and not workers.threads_should_move
        assert workers.from_thread() is None  # no connection is on its thread now
        third = workers.assign()  # with a worker running, nobody decodes on a thread again
        assert third is not None and workers.moves == 1
        for link in (second, moved, third):
            link.close()
    finally:
        workers.stop()


def test_a_worker_left_without_connections_stops_unless_it_is_the_last_or_awaited() -> None:
    """A node collector outlives its jobs: a worker whose last connection closed stops (its CPU
    time still counted), except the only one left (the next probe's) and one that connections
    are moving to."""
    workers = WorkerPool(3, per_worker=1)
    try:
        first, second, third = (workers.assign() for _ in range(3))
        assert first is not None and second is not None and third is not None
        assert workers.started == 3 and len({k.worker for k in (first, second, third)}) == 3
        for link in (first, second, third):
            _until_ready(link.worker)
        third.move_to = second.worker  # as a split would tell it: second's worker is awaited
        second.close()
        assert second.worker.alive()  # kept: a connection is coming to it
        third.move_to = None
        first.close()
        first.worker.process.wait(10)  # stopped: its socket closed, it exits
        assert workers.cpu_s > 0  # its CPU time was read as it stopped
        third.close()  # third's worker stops too; second's, with no connection, is the one left
        third.worker.process.wait(10)
        assert second.worker.alive()
        again = workers.assign()  # the next probe goes to the one kept; none starts
        assert again is not None and again.worker is second.worker and workers.started == 3
        again.close()
        assert second.worker.alive()
    finally:
        workers.stop()
    assert workers.died == 0


def test_a_move_the_new_worker_cannot_take_keeps_the_stream_whole(buffers: Any, two_workers: Any) -> None:
    data, _ = buffers
    workers, pool = two_workers
    reference = _decode_all(workers, pool, data, None)
    events, losses, errors, window, counts, local = _decode_all(
        workers, pool, data, len(data) // 2, kill_first=True
    )
    assert local  # decoded in this thread after the failed move
    assert (events, losses, window, counts) == (reference[0], reference[1], reference[3], reference[4])
    told = [e for e in errors if e not in reference[2]]
    assert len(told) == 1 and told[0][0] == "collector:decode_worker", errors
    assert "nothing was lost" in told[0][1] and "decoded on its connection thread" in told[0][1]


def test_the_pool_splits_a_busy_worker_and_moves_the_heavier_half(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_pool, "BALANCE_S", 0.0)
    workers = WorkerPool(2, per_worker=8, split_load=0.0)  # any load is "busy"
    try:
        links = [workers.assign() for _ in range(4)]
        assert all(link is not None for link in links) and workers.started == 1
        workers.balance()  # still starting up (importing): its CPU time is not the probes' load
        assert workers.started == 1
        _until_ready(links[0].worker)  # type: ignore[union-attr]
        workers.balance()  # the first look after it started up only reads its CPU time
        assert workers.started == 1
        for link, requested in zip(links, (900, 100, 500, 450), strict=True):
            assert link is not None
            link.requested = requested  # bytes asked for since that look
        time.sleep(0.05)
        workers.balance()
        assert workers.started == 2
        told = [link for link in links if link is not None and link.move_to is not None]
        # Heaviest first, each to the lighter side: {900, 100} stay, {500, 450} move
        assert sorted(link.recent for link in told) == [450, 500]
        first = told[0]
        target = first.move_to
        assert target is not None
        os.kill(target.pid, signal.SIGSTOP)  # not started up yet: the move waits
        assert workers.moved(first) is None and first.move_to is target
        os.kill(target.pid, signal.SIGCONT)
        _until_ready(target)
        fresh = workers.moved(first)
        assert fresh is not None and fresh.worker is target and target is not first.worker
        assert first.move_to is None and workers.moves == 1 and target.connections == 1
        workers.balance()  # the pool is full: no third worker
        assert workers.started == 2
        first.close()
        fresh.close()
    finally:
        for link in links:
            if link is not None:
                link.close()
        workers.stop()


def test_handover_keeps_the_names_read_and_leaves_the_emitter_behind(buffers: Any) -> None:
    data, names = buffers
    sink = Collect()
    info = OpenStream(stream=3, source="activity", struct_sizes=dict(CAPTURE.struct_sizes))
    stream = DecodeStream(info, os.getpid(), sink, None, StatisticsConfig(interval=1.0))  # type: ignore[arg-type]
    stream.decode(memoryview(data[0]), len(data[0]), 0)
    before = len(sink.events)
    state = handover.dump(stream)
    seen = dict(stream.names.seen)  # type: ignore[union-attr]
    stream.names.close()  # type: ignore[union-attr]
    other = Collect()
    back = handover.load(state, other, None)  # opens our memory again
    assert back.emitter is other and back.names.seen == seen  # type: ignore[union-attr]
    assert set(seen.values()) & set(names.values())  # kernel names were read before the move
    back.decode(memoryview(data[1]), len(data[1]), 0)
    assert other.events and len(sink.events) == before  # what it decodes now goes to the new emitter
    back.close()


# --- end to end ------------------------------------------------------------------------------

# The 2-core VM gives ``auto`` one worker: the collector is told it has 4 CPUs and that any load
# is busy, so that its workers split as they would on a loaded host (nothing else is changed).
_SPLITTING = """
import os, sys
from cuptistream.collector import worker_pool
worker_pool.SPLIT_LOAD, worker_pool.BALANCE_S = 0.0, 0.2
os.sched_getaffinity = lambda pid: set(range(4))
from cuptistream.cli import main
sys.exit(main(sys.argv[1:]))
"""
_PROBES = "import subprocess, sys; [p.wait() for p in [subprocess.Popen([sys.executable, '-c', '0']) for _ in range(4)]]"


def _run(tmp: Path, workers: int | str) -> dict[str, Any]:
    cfg = {
        "pipeline": {"decode_workers": workers, "full_policy": "block"},
        # Paced (4 s a probe), so that the workers split and have started up while there is
        # still decoding to move
        "sources": [
            {
                "type": "replay",
                "loops": 40,
                "interval": "50ms",
                "path": str(DEFAULT_PATH / "torch_train.cupti"),
            }
        ],
        "statistics": {"interval": "1s", "max_names": 4},
        "sinks": [{"type": "file", "directory": str(tmp / "out")}],
    }
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    command = [sys.executable, "-c", _SPLITTING, "run", "-c", str(tmp / "cfg.json"), "--report-json",
               str(tmp / "report.json"), "--quiet", "--", sys.executable, "-c", _PROBES]  # fmt: skip
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr  # e.g. a worker that did not take its hang-up
    return dict(json.loads((tmp / "report.json").read_text()))


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_a_run_whose_workers_split_writes_what_in_thread_decoding_writes(tmp_path: Path) -> None:
    data = {}
    for workers in (0, "auto"):
        tmp = tmp_path / str(workers)
        tmp.mkdir()
        report = _run(tmp, workers)
        events = list(cuptistream.read(tmp / "out"))
        kept = [e for e in events if not isinstance(e, SelfStats | Loss | Error)]
        dropped = sum(v for k, v in report["losses"].items() if k.split("/")[0] in ("intake", "sink:file"))
        assert report["events_in"] == len(kept) + dropped
        data[workers] = (report, kept, [e for e in events if isinstance(e, Error)])
    (before, in_thread, _), (after, split, errors) = data[0], data["auto"]
    assert after["decode_worker_moves"] >= 1 and after["decode_workers"] >= 2, after
    assert not errors, errors
    assert sorted(map(msgspec.msgpack.encode, split)) == sorted(map(msgspec.msgpack.encode, in_thread))
    for key in ("events_in", "activity_buffers", "activity_records"):
        assert before[key] == after[key], key
