"""Decode workers (``pipeline.decode_workers``) end to end: real ``cuptistream run``
collectors with replay probes over the shipped captures, real worker processes, memfds and sockets.

- a worker decodes to exactly the events in-thread decoding writes (statistics included);
- a worker killed with SIGKILL mid-request turns into counted losses and one Error event, the probe
  is decoded in the collector from then on, and the run finishes with exact accounting;
- a worker does not outlive its collector;
- a bad value is one line naming the key.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

import cuptistream
from cuptistream.collector import worker_protocol as wp
from cuptistream.collector.names import ProcessNames, open_memory
from cuptistream.collector.worker_pool import worker_pids
from cuptistream.events import Error, Loss, SelfStats
from cuptistream.sources.replay import DEFAULT_PATH
from tests.slot_buffers import remotely, through_slot

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
CONTROL = (SelfStats, Loss, Error)  # the collector's accounting; its timing differs run to run


def _config(tmp: Path, workers: int, loops: int, path: str = "", replies: str = "heap") -> Path:
    cfg = {
        "pipeline": {"decode_workers": workers, "full_policy": "block", "worker_replies": replies},
        "sources": [{"type": "replay", "loops": loops, "path": path}],
        "statistics": {"interval": "1s", "max_names": 4},
        "sinks": [{"type": "file", "directory": str(tmp / "out")}],
    }
    path = tmp / "cfg.json"
    path.write_text(json.dumps(cfg))
    return path


def _run(
    tmp: Path, workers: int, program: list[str], loops: int, path: str = "", replies: str = "heap"
) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(_config(tmp, workers, loops, path, replies)),
               "--report-json", str(tmp / "report.json"), "--quiet", "--", *program]  # fmt: skip
    return subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finished(run: subprocess.Popen[str], tmp: Path) -> dict[str, Any]:
    _out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert "Traceback" not in err, err  # the workers, too, end quietly
    return dict(json.loads((tmp / "report.json").read_text()))


def _wait_for_worker(pid: int, timeout: float = 30) -> int:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        if found := worker_pids(pid):
            return found[0]
        time.sleep(0.05)
    raise AssertionError("no decode worker started")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _accounting(tmp: Path, report: dict[str, Any]) -> list[Any]:
    """Every event on disk, after checking ``events_in == data events on disk + counted drops``."""
    events = list(cuptistream.read(tmp / "out"))
    data = [e for e in events if not isinstance(e, CONTROL)]
    dropped = sum(v for k, v in report["losses"].items() if k.split("/")[0] in ("intake", "sink:file"))
    assert report["events_in"] == len(data) + dropped
    return events


@pytest.mark.parametrize("replies", ["heap", "mapped", "shared"])
def test_a_worker_writes_exactly_what_in_thread_decoding_writes(tmp_path: Path, replies: str) -> None:
    runs = {}
    for workers in (0, 2):
        tmp = tmp_path / f"w{workers}"
        tmp.mkdir()
        # One capture, so one stream: the order is a stream's (captures replay into pools of their
        # own, and the order across pools is the probe's timing, with or without workers).
        capture = str(DEFAULT_PATH / "torch_train.cupti")
        run = _run(tmp, workers, [sys.executable, "-c", "0"], loops=3, path=capture, replies=replies)
        report = _finished(run, tmp)
        assert report["decode_workers"] == (1 if workers else 0)  # one probe: one worker started
        assert report["decode_workers_died"] == 0
        runs[workers] = (report, _accounting(tmp, report))
    (before, in_thread), (after, in_worker) = runs[0], runs[2]
    data = [e for e in in_thread if not isinstance(e, CONTROL)]
    # The same events. Not in the same order: consecutive buffers that queued up are decoded as one
    # (connection.JOIN_BYTES), and within a decode events come grouped by kind; which buffers queue
    # up is the run's timing.
    assert sorted(map(msgspec.msgpack.encode, data)) == sorted(
        map(msgspec.msgpack.encode, (e for e in in_worker if not isinstance(e, CONTROL)))
    )
    assert any(type(e).__name__ == "ActivityStats" for e in data)  # the statistics among them
    assert any(type(e).__name__ == "GpuStats" for e in data)
    assert before["losses"] == after["losses"]  # e.g. the statistics' late records, counted alike
    for key in ("events_in", "activity_buffers", "activity_records", "activity_records_withheld"):
        assert before[key] == after[key], key
    assert after["decode_workers_cpu_s"] > 0
    if replies == "shared":  # every request's events were packed into a reply slot (one or more buffers each)
        assert 0 < after["reply_slot_replies"] <= after["activity_buffers"]
        assert after["reply_slot_full"] == 0


def test_the_file_sink_stores_the_hot_kinds_as_columns_and_a_flipped_frame_loses_only_itself(
    tmp_path: Path,
) -> None:
    """A real run with a worker writes kernels and API calls as ``Columns`` elements, which read
    back as every event (``_accounting``). A bit flipped inside a frame that holds columns loses
    that batch alone, reported at its offset: the tolerant reader's guarantee, as for maps."""
    import warnings

    import zstandard

    from cuptistream.recording.codec import has_columns
    from cuptistream.recording.framing import Frame, scan_frames

    capture = str(DEFAULT_PATH / "torch_train.cupti")
    report = _finished(_run(tmp_path, 1, [sys.executable, "-c", "0"], loops=12, path=capture), tmp_path)
    events = _accounting(tmp_path, report)
    path = max(
        (tmp_path / "out").iterdir(), key=lambda p: p.stat().st_size
    )  # the program's, not the collector's
    with path.open("rb") as handle:
        frames = [f for f in scan_frames(handle, str(path)) if isinstance(f, Frame)]
    columnar = [f for f in frames if has_columns(f.payload)]
    assert len(frames) >= 2 and columnar, (len(frames), len(columnar))
    hit = columnar[len(columnar) // 2]
    lost = len(cuptistream.recording.codec.decode_batch(hit.payload).events)
    data = bytearray(path.read_bytes())
    data[hit.offset + hit.length // 2] ^= 0x10
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader = cuptistream.read(tmp_path / "out")
        after = list(reader)
    assert len(after) == len(events) - lost
    assert [(d.offset, d.length) for d in reader.damage] == [(hit.offset, hit.length)]
    intact = next(f for f in frames if f is not hit)  # another frame of the file reads as before
    assert zstandard.ZstdDecompressor().decompress(
        bytes(data[intact.offset : intact.offset + intact.length])
    ) == (intact.payload)


@pytest.mark.slow  # waits out a killed worker's timeout: about 10 s
def test_a_killed_worker_is_counted_and_the_probe_decoded_in_the_collector(tmp_path: Path) -> None:
    # An endless replay keeps the worker busy; SIGSTOP first, so a request is surely in flight when
    # the SIGKILL lands (the connection sends its next buffer and waits for the reply).
    run = _run(tmp_path, 1, [sys.executable, "-c", "import time; time.sleep(5)"], loops=0)
    try:
        worker = _wait_for_worker(run.pid)
        time.sleep(1.5)
        os.kill(worker, signal.SIGSTOP)
        time.sleep(0.5)
        os.kill(worker, signal.SIGKILL)
        report = _finished(run, tmp_path)
    finally:
        run.kill()
    assert report["decode_workers"] == 1 and report["decode_workers_died"] == 1
    assert report["losses"].get("collector/decode_worker_died", 0) > 0  # that buffer, in records
    events = _accounting(tmp_path, report)
    errors = [e for e in events if isinstance(e, Error) and e.origin == "collector:decode_worker"]
    assert len(errors) == 1 and f"decode worker {worker}" in errors[0].message, errors
    assert "signal 9" in errors[0].message
    losses = [e for e in events if isinstance(e, Loss) and e.reason == "decode_worker_died"]
    assert losses and all(e.stage == "collector" and e.unit == "records" for e in losses)
    after = [e for e in events[events.index(errors[0]) :] if type(e).__name__ == "Kernel"]
    assert after  # decoding went on in the collector
    assert report["activity_records"] > 0 and not _alive(worker)


def test_a_worker_does_not_outlive_its_collector(tmp_path: Path) -> None:
    program = [sys.executable, "-c", "import time; time.sleep(30)"]
    run = _run(tmp_path, 1, program, loops=0)
    try:
        worker = _wait_for_worker(run.pid)
        run.send_signal(signal.SIGKILL)  # the collector; its program goes on, unprobed from now on
        run.wait(10)
        ends = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < ends:
            time.sleep(0.05)
        assert not _alive(worker)
    finally:
        run.kill()
        for child in Path("/proc").glob("[0-9]*"):  # the orphaned program: ours, by its command line
            try:
                if b"time.sleep(30)" in (child / "cmdline").read_bytes():
                    os.kill(int(child.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue


@pytest.mark.parametrize(("value", "says"), [("-1", "between 0 and 256"), ("many", "many"), ("1.5", "int")])
def test_a_bad_decode_workers_value_is_one_line_naming_the_key(tmp_path: Path, value: str, says: str) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"pipeline: {{decode_workers: {value}}}\nsinks: [{{type: stdout}}]\n")
    done = subprocess.run([sys.executable, "-m", "cuptistream.cli", "validate", str(cfg)],
                          capture_output=True, text=True, env=ENV, timeout=60)  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "decode_workers" in lines[0] and says in lines[0], lines


def test_names_read_through_a_memory_fd_opened_elsewhere() -> None:
    # A worker gets the collector's open /proc/PID/mem; reading through a handed-over fd works
    # as opening it does (here: this process's own memory).
    import ctypes

    text = ctypes.create_string_buffer(b"my_kernel(float*)")
    names = ProcessNames(os.getpid(), open_memory(os.getpid()))
    try:
        assert names(ctypes.addressof(text)) == "my_kernel(float*)" and names.failure is None
    finally:
        names.close()
    missing = ProcessNames(2**22 + 7, (None, "cannot read kernel names from process 4194311: gone"))
    assert missing(0x1000).startswith("<unresolved") and missing.failure is not None


@pytest.mark.parametrize(
    ("records", "replies"),
    [("all", "socket"), ("on_demand", "socket"), ("all", "shared"), ("all", "shared-spilling")],
)
def test_a_remote_stream_answers_as_a_decode_stream_does(
    tmp_path: Path, records: str, replies: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream's whole surface through a real worker: decode from a real memfd slot, a trace
    window's ``WindowRecords``, the statistics at close, and the ``capture`` file it writes.
    ``shared``: the events come back in reply slots (``worker_replies: shared``); ``-spilling``:
    slots of the buffer's own size, too small for its events, so the rest comes over the socket."""
    from cuptistream.channel.messages import OpenStream, TraceSpan
    from cuptistream.channel.shm import ACTIVITY, SlotPool
    from cuptistream.collector import reply_slots, worker_pool
    from cuptistream.collector.decoding import DecodeStream
    from cuptistream.collector.remote_stream import RemoteStream
    from cuptistream.collector.reply_slots import ReplySlots
    from cuptistream.collector.worker_pool import WorkerPool
    from cuptistream.config.model import StatisticsConfig
    from cuptistream.cupti import capture
    from cuptistream.sources.replay import DEFAULT_PATH
    from tests.gpu.workloads.collect import Collect

    cap = capture.read(DEFAULT_PATH / "torch_train.cupti")
    size = max(len(b.data) for b in cap.buffers)
    pool = SlotPool.create("test", size + 8, 2)
    statistics = StatisticsConfig(interval=1.0)  # type: ignore[arg-type]
    slots = ReplySlots(max_bytes=64 << 20, idle_bytes=8 << 20) if replies != "socket" else None
    if replies == "shared-spilling":
        monkeypatch.setattr(worker_pool, "REPLY_EXPANSION", 1.0)
        monkeypatch.setattr(reply_slots, "_ROUND", 4096)
        monkeypatch.setattr(reply_slots, "ARENA_BYTES", 0)  # a slot per reply, of the buffer's size
    workers = WorkerPool(1, reply_slots=slots)
    moved = {"slot": 0, "socket": 0}  # event bytes by how replies brought them
    receive = wp.receive_reply

    def receive_counting(sock: Any, maps: Any = None) -> wp.Reply | None:
        reply = receive(sock, maps)
        for call in reply.calls if reply is not None else ():
            if isinstance(call, wp.EmitSlotChunk):
                moved["slot"] += call.size
            elif isinstance(call, wp.EmitChunk):
                moved["socket"] += len(call.payload)
        return reply

    monkeypatch.setattr(wp, "receive_reply", receive_counting)
    outcomes = []
    try:
        for remote in (False, True):
            info = OpenStream(stream=3, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings),
                              records=records, capture=str(tmp_path / f"{remote}.cupti"))  # fmt: skip
            sink = Collect()
            link = workers.assign() if remote else None
            if link is not None:
                link.map_pool(0, pool)
                stream: DecodeStream | RemoteStream = RemoteStream(link, info, 0, sink, None, statistics)
            else:
                stream = DecodeStream(info, 0, sink, None, statistics)
            first = TraceSpan(stream=3, window=1, start=1, on_demand=True, kinds=["concurrent_kernel"])
            assert stream.trace_span(first) is None
            for buf in cap.buffers:
                slot = pool.take()
                assert slot is not None
                pool.view(slot)[: len(buf.data)] = buf.data
                pool.publish(slot, ACTIVITY, 3, len(buf.data), buf.dropped)
                view = pool.view(slot, len(buf.data))
                if isinstance(stream, RemoteStream):
                    stream.decode_slots(0, [(slot, (view, len(buf.data), buf.dropped))])
                    # Its chunks are the pipeline's now: kept by the stream until the next reply,
                    # they outlived the sinks' release, outside memory_budget (23 MiB per probe).
                    assert stream._counts.calls == [], "the stream keeps the reply's chunks"
                else:
                    stream.decode(view, len(buf.data), buf.dropped)
                del view
                pool.release(slot)
            window = stream.trace_span(
                TraceSpan(stream=3, window=1, start=1, end=2**62, on_demand=True, kinds=["concurrent_kernel"])
            )
            stream.close()
            if link is not None:
                assert not link.broken, link.problem
                link.close()
            counts = (stream.buffers, stream.records, stream.records_withheld, stream.events)
            outcomes.append(
                (sink.events, sink.losses, sink.errors, window, counts, capture.read(info.capture))
            )
    finally:
        workers.stop()
        pool.close()
    (events, losses, errors, window, counts, written), remote_outcome = outcomes
    assert events and window is not None and window.records
    assert remote_outcome[:5] == (events, losses, errors, window, counts)
    assert (
        remote_outcome[5].buffers == written.buffers == cap.buffers
        and remote_outcome[5].strings == written.strings
    )
    assert workers.started == 1 and workers.died == 0 and workers.cpu_s > 0
    if slots is not None:  # every buffer named a slot, and its events came back where they fit
        assert slots.replies >= len(cap.buffers) and slots.full == 0
        in_slots, over_socket = moved["slot"], moved["socket"]
        if replies == "shared":  # the socket carried the statistics' events alone
            assert in_slots > 5 * over_socket > 0
        else:  # slots of a buffer's size hold a quarter of what its events pack into
            assert over_socket > in_slots > 0


@contextlib.contextmanager
def _shared_replies(sink: Any) -> Iterator[tuple[Any, Any, Callable[[], None]]]:
    """A real worker under ``worker_replies: shared``: its reply slots, a link to it and a
    ``RemoteStream`` on that link emitting to ``sink``, and a call that decodes the replayed
    capture's largest buffer through a real pool slot. The stream closes on the way out."""
    from cuptistream.channel.messages import OpenStream
    from cuptistream.channel.shm import SlotPool
    from cuptistream.collector.remote_stream import RemoteStream
    from cuptistream.collector.reply_slots import ReplySlots
    from cuptistream.collector.worker_pool import WorkerPool
    from cuptistream.cupti import capture

    cap = capture.read(DEFAULT_PATH / "torch_train.cupti")
    data = max((b.data for b in cap.buffers), key=len)
    slots = ReplySlots(max_bytes=64 << 20, idle_bytes=8 << 20)
    workers = WorkerPool(1, reply_slots=slots)
    pool = SlotPool.create("shared-replies", len(data) + 8, 2)
    try:
        link = workers.assign()
        assert link is not None
        link.map_pool(0, pool)
        info = OpenStream(
            stream=1, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings)
        )
        stream = RemoteStream(link, info, 0, sink)
        yield slots, link, lambda: through_slot(pool, 1, data, remotely(stream))
        stream.close()
        assert not link.broken, link.problem
        link.close()
    finally:
        workers.stop()
        pool.close()


def test_a_links_replies_pack_one_after_another_into_its_slot_and_each_counts_its_own_part() -> None:
    """Under ``worker_replies: shared`` a link's consecutive replies go into one reply slot (its
    ``Arena``), the second after the first; the memory budget counts each reply's own part of the
    slot (``ChunkGroup``), not the slot from its start. A slot per reply would use up every slot
    within the budget as soon as the sinks fall behind with several probes."""
    from cuptistream.recording.codec import Chunk
    from tests.gpu.workloads.collect import Collect

    class Groups(Collect):
        """Keeps each chunk, as a sink holds it, and the reply slot part it views."""

        def __init__(self) -> None:
            super().__init__()
            self.chunks: list[Chunk] = []

        def emit_chunk(self, chunk: Chunk) -> None:
            self.chunks.append(chunk)
            super().emit_chunk(chunk)

    sink = Groups()
    with _shared_replies(sink) as (slots, _link, decode):
        replies = []
        for _ in range(2):
            before = len(sink.chunks)
            decode()
            replies.append(sink.chunks[before:])
        assert slots.replies == 2 and slots.created == 1  # one slot for both
        mapping = slots.view(0, 0, 0).obj
    first, second = (
        [c for c in r if isinstance(c.payload, memoryview) and c.payload.obj is mapping] for r in replies
    )
    assert first and second
    ends = [max(_offset(c) + len(c.payload) for c in r) for r in (first, second)]
    starts = [min(_offset(c) for c in r) for r in (first, second)]
    assert starts[1] >= ends[0] > 0  # the second reply went after the first
    for reply, chunks, start, end in zip(replies, (first, second), starts, ends, strict=True):
        group = chunks[0].group
        assert group is not None and all(c.group is group for c in reply)
        # What came over the socket (the statistics' events) counts as the block it landed in.
        sent = [c.payload for c in reply if c not in chunks]
        block = len(sent[0].obj) if sent and isinstance(sent[0], memoryview) else sum(len(p) for p in sent)
        assert group.nbytes == max(block, sum(len(p) for p in sent)) + end - start  # its part, not from 0


def test_a_resting_link_lets_its_reply_slot_go() -> None:
    """A probe that sends nothing for a while holds no reply slot: ``Link.rest`` (the connection
    calls it when its socket stays quiet for ``_POLL_S``) lets the link's slot go, so that another
    link can take it, or the trim give its pages back."""
    from cuptistream.collector.reply_slots import ARENA_BYTES
    from tests.gpu.workloads.collect import Collect

    with _shared_replies(Collect()) as (slots, link, decode):  # Collect decodes chunks, keeps no view
        decode()
        other = slots.take(ARENA_BYTES)  # the link holds slot 0 for its next reply
        assert other is not None and other.slot == 1
        other.release()
        link.rest()
        again = slots.take(ARENA_BYTES)  # the least recently taken idle slot: the link's, let go
        assert again is not None and again.slot == 0
        again.release()


def _offset(chunk: Any) -> int:
    """Where a chunk's payload (a view of a reply slot) starts in the slot."""
    view = chunk.payload
    base = np.frombuffer(view.obj, np.uint8)  # the slot's whole mapping
    return int(np.frombuffer(view, np.uint8).ctypes.data - base.ctypes.data)


def test_a_worker_reads_kernel_names_from_the_program_through_the_collectors_fd(tmp_path: Path) -> None:
    """Names are read from a live process's memory (``strings`` None, as with a real probe): the
    collector opens ``/proc/PID/mem`` and hands the fd to the worker with the stream."""
    import numpy as np

    from cuptistream.channel.messages import OpenStream
    from cuptistream.channel.shm import SlotPool
    from cuptistream.collector.remote_stream import RemoteStream
    from cuptistream.collector.worker_pool import WorkerPool
    from cuptistream.cupti import capture
    from cuptistream.cupti.kinds import BY_VALUE
    from cuptistream.cupti.records import RecordLayouts, walk
    from cuptistream.events import Kernel
    from cuptistream.sources.replay import DEFAULT_PATH
    from tests.gpu.workloads.collect import Collect

    cap = capture.read(DEFAULT_PATH / "torch_train.cupti")
    layouts = RecordLayouts(dict(cap.struct_sizes))
    buffers, pointers = [], set()
    for buf in cap.buffers:
        data = bytearray(buf.data)
        kernels = []
        for kind, offsets in walk(memoryview(data), len(data), layouts, None).items():
            chosen = layouts.dtype(kind)
            if BY_VALUE[kind].event == "kernel" and chosen is not None:
                kernels += [np.ndarray((1,), chosen[1], buffer=data, offset=o) for o in offsets]
        pointers.update(int(k["name"][0]) for k in kernels)
        buffers.append((data, kernels))
    # The program: the kernel names at addresses of its own, printed, kept until stdin closes.
    code = (
        "import ctypes, sys\n"
        f"names = {{p: ctypes.create_string_buffer(cap.encode()) for p, cap in {dict((p, cap.strings[p]) for p in pointers)!r}.items()}}\n"
        "print(' '.join(f'{p}:{ctypes.addressof(b)}' for p, b in names.items()), flush=True)\n"
        "sys.stdin.read()\n"
    )  # fmt: skip
    program = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    workers = WorkerPool(1)
    pool = SlotPool.create("names", max(len(d) for d, _ in buffers) + 8, 2)
    try:
        assert program.stdout is not None
        moved = dict(tuple(map(int, pair.split(":"))) for pair in program.stdout.readline().split())
        for _data, kernels in buffers:
            for kernel in kernels:
                kernel["name"][0] = moved[int(kernel["name"][0])]
        link = workers.assign()
        link.map_pool(0, pool)
        sink = Collect()
        info = OpenStream(stream=0, source="activity", struct_sizes=dict(cap.struct_sizes))  # strings None
        stream = RemoteStream(link, info, program.pid, sink)
        for data, _ in buffers:
            through_slot(pool, 0, data, remotely(stream))
        stream.close()
        assert not link.broken, link.problem
        link.close()
    finally:
        workers.stop()
        pool.close()
        program.communicate("")
    kernels = [e for e in sink.events if isinstance(e, Kernel)]
    # Every kernel's name read from the program (other kinds' pointers were not moved: those fail
    # to read, as they would in the collector, and say so in a warning).
    assert kernels and {k.name for k in kernels} == {cap.strings[p] for p in pointers}


def test_a_request_the_worker_fails_is_counted_and_the_rest_decoded_in_the_collector() -> None:
    """A worker that cannot serve a request (here: a pool it was never given) answers with the
    problem: that buffer counts as ``decode_worker_failed`` (records), one Error, and the stream
    decodes every later buffer in the connection's thread."""
    from cuptistream.channel.messages import OpenStream
    from cuptistream.channel.shm import SlotPool
    from cuptistream.collector.decoding import Buffer, DecodeStream
    from cuptistream.collector.remote_stream import RemoteStream
    from cuptistream.collector.worker_pool import WorkerPool
    from cuptistream.cupti import capture
    from cuptistream.sources.replay import DEFAULT_PATH
    from tests.gpu.workloads.collect import Collect

    cap = capture.read(DEFAULT_PATH / "torch_train.cupti")
    assert len(cap.buffers) >= 2
    info = OpenStream(
        stream=0, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings)
    )
    pool = SlotPool.create("failed", max(len(b.data) for b in cap.buffers) + 8, 2)
    workers = WorkerPool(1)
    sink, reference = Collect(), Collect()
    first: tuple[int, int] | tuple[()] = ()
    try:
        link = workers.assign()  # no map_pool: the worker cannot find the slot
        stream = RemoteStream(link, info, 0, sink)
        local = DecodeStream(info, 0, reference)

        def both(slot: int, buffer: Buffer) -> None:
            stream.decode_slots(0, [(slot, buffer)])
            local.decode(*buffer)

        for buf in cap.buffers:
            through_slot(pool, 0, buf.data, both)
            if not first:  # what the buffer the worker failed holds
                first = (local.records, len(reference.events))
        stream.close()
        link.close()
    finally:
        workers.stop()
        pool.close()
    assert link.broken and link.reason == "decode_worker_failed"
    assert first and first[0] > 0
    records, events = first
    lost = [loss for loss in sink.losses if loss[1] == "decode_worker_failed"]
    assert lost == [("collector", "decode_worker_failed", records, "records")]
    assert sink.events == reference.events[events:]  # every later buffer, decoded in the collector
    assert len(sink.errors) == 1 and sink.errors[0][0] == "collector:decode_worker", sink.errors
    assert stream.records == local.records - records


def test_auto_is_one_worker_per_cpu_but_one_at_most_eight() -> None:
    from cuptistream.config.model import PipelineConfig

    cpus = len(os.sched_getaffinity(0))
    assert PipelineConfig().decode_worker_count() == max(0, min(8, cpus - 1))
    assert PipelineConfig(decode_workers=0).decode_worker_count() == 0
    assert PipelineConfig(decode_workers=3).decode_worker_count() == 3
    assert PipelineConfig().decode_worker_count(in_program=True) == 0
    assert PipelineConfig(decode_workers=3).decode_worker_count(in_program=True) == 3


def test_a_session_with_its_own_sinks_starts_no_worker_in_the_program(tmp_path: Path) -> None:
    """``session(sinks=...)`` runs the collector as threads of this process: under ``auto`` it
    decodes the replayed captures there, with no child process of ours in the program's tree."""
    import cuptistream
    from tests.pipeline_helpers import MemorySink

    config = {"sources": [{"type": "replay", "loops": 1}], "sinks": [{"type": "null"}]}
    sink = MemorySink("memory")
    with cuptistream.session(config, sinks=[sink], quiet=True) as session:
        collector = session._embedded
        assert collector is not None and collector.workers is None
    assert session.report is not None and session.report.decode_workers == 0
    assert any(b.events for b in sink.batches)


def test_under_auto_the_first_probe_decodes_in_its_own_thread() -> None:
    """``in_thread=1`` (what ``auto`` sets): the first connection decodes on its own thread (no
    worker round trip for the common single-probe run) while no worker runs; the next ones get
    workers (and the first is told to move to one: tests/test_decode_moves.py). Once that
    connection has left, a new one alone decodes on its thread again."""
    from cuptistream.collector.worker_pool import WorkerPool

    workers = WorkerPool(2, in_thread=1)
    try:
        assert workers.assign() is None  # the first: its own thread
        workers.leave_thread()
        assert workers.assign() is None  # it left before any other came: the next alone takes its place
        second = workers.assign()
        assert second is not None and second.worker.alive()
        assert workers.started == 1 and workers.threads_should_move
        workers.leave_thread()
        third = workers.assign()  # a worker runs: no connection goes to a thread now
        assert third is not None and third.worker.alive()
        second.close()
        third.close()
    finally:
        workers.stop()


def test_with_per_worker_a_worker_takes_that_many_connections_before_the_next_starts() -> None:
    """``per_worker`` (what ``auto`` sets): a new worker starts only when each running one has that
    many connections; a connection that leaves makes room on its worker before a new one starts."""
    from cuptistream.collector.worker_pool import WorkerPool

    workers = WorkerPool(3, per_worker=2)
    try:
        links = [workers.assign() for _ in range(5)]
        assert all(link is not None for link in links)
        assigned = [link.worker.pid for link in links if link is not None]
        assert workers.started == 3
        assert assigned[0] == assigned[1] and assigned[2] == assigned[3] and assigned[4] not in assigned[:4]
        first = links[0]
        assert first is not None
        first.close()  # the first worker has room again: the next connection goes there
        again = workers.assign()
        assert again is not None and again.worker.pid == assigned[0] and workers.started == 3
        for link in [*links[1:], again]:
            if link is not None:
                link.close()
    finally:
        workers.stop()


@pytest.mark.parametrize(("mapped", "kind"), [(False, bytearray), (True, mmap.mmap)])
def test_a_reply_of_several_fragments_lands_in_the_heap_or_a_private_mapping(
    mapped: bool, kind: type
) -> None:
    """``pipeline.worker_replies``: the payloads arrive intact either way; ``mapped`` puts them in a
    private mapping of their own (freed with its last view), the default in one heap buffer."""
    import threading

    from cuptistream.collector import worker_protocol as wp

    ours, theirs = wp.pair()
    payloads = [os.urandom(300_000), b"", os.urandom(70_000)]  # several 128 KiB fragments
    reply = wp.Reply(calls=[wp.EmitChunk(p, i + 1, i + 1) for i, p in enumerate(payloads)], events=3)
    sender = threading.Thread(target=wp.send_reply, args=(theirs, reply))
    sender.start()
    from cuptistream.collector.reply_maps import ReplyMaps

    got = wp.receive_reply(ours, ReplyMaps(1 << 20) if mapped else None)
    sender.join()
    ours.close()
    theirs.close()
    assert got is not None and got.events == 3
    chunks = [call for call in got.calls if isinstance(call, wp.EmitChunk)]
    assert [bytes(c.payload) for c in chunks] == payloads and [c.count for c in chunks] == [1, 2, 3]
    assert isinstance(chunks[0].payload.obj, kind)
