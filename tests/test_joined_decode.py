"""Consecutive buffers of a stream decoded as one (``DecodeStream.decode_many``; the connection
joins the buffers that queued up, ``connection.JOIN_BYTES``): the same events, counts and
statistics as decoding them one by one, and a buffer that cannot be walked loses itself only.

The buffers are the shipped real-GPU captures' (``tests/fixtures/README.md``), cut at record
boundaries into pieces the size CUPTI hands over when it flushes often."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

from cuptistream.channel.messages import OpenStream
from cuptistream.collector.decoding import Buffer, DecodeStream, join
from cuptistream.config.model import StatisticsConfig
from cuptistream.cupti import capture
from cuptistream.cupti.records import LayoutError, RecordLayouts, walk
from cuptistream.sources.replay import DEFAULT_PATH
from tests.gpu.workloads.collect import Collect
from tests.replay_probes import run_replay_probes

CAPTURES = ["torch_train.cupti", "exact_counts.cupti", "graph_trace.cupti"]


def _pieces(cap: capture.Capture, parts: int) -> list[bytes]:
    """Every captured buffer cut at record boundaries into about ``parts`` pieces, in order."""
    layouts = RecordLayouts(dict(cap.struct_sizes))
    pieces = []
    for buf in cap.buffers:
        offsets = sorted(
            o for found in walk(memoryview(buf.data), len(buf.data), layouts, None).values() for o in found
        )
        cuts = [offsets[i * len(offsets) // parts] for i in range(1, parts)]
        edges = [0, *sorted(set(cuts)), len(buf.data)]
        pieces += [bytes(buf.data[a:b]) for a, b in itertools.pairwise(edges) if b > a]
    return pieces


def _stream(cap: capture.Capture, sink: Collect) -> DecodeStream:
    info = OpenStream(
        stream=0, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings)
    )
    return DecodeStream(info, 0, sink, None, StatisticsConfig(interval=1.0))  # type: ignore[arg-type]


def _buffers(pieces: list[bytes]) -> list[Buffer]:
    return [(memoryview(bytearray(p)), len(p), 0) for p in pieces]


def _encoded(events: Sequence[object]) -> list[bytes]:
    return sorted(msgspec.msgpack.encode(e) for e in events)


@pytest.mark.parametrize("name", CAPTURES)
def test_buffers_decoded_as_one_give_the_events_counts_and_statistics_of_each_alone(name: str) -> None:
    cap = capture.read(DEFAULT_PATH / name)
    pieces = _pieces(cap, 6)
    assert len(pieces) >= 6
    alone, joined = Collect(), Collect()
    one_by_one, together = _stream(cap, alone), _stream(cap, joined)
    for buffer in _buffers(pieces):
        one_by_one.decode(*buffer)
    together.decode_many(_buffers(pieces))
    one_by_one.close()
    together.close()
    assert joined.events and _encoded(joined.events) == _encoded(alone.events)  # statistics included
    assert joined.losses == alone.losses and not joined.errors
    assert together.buffers == one_by_one.buffers == len(pieces)
    assert together.records == one_by_one.records > 0
    assert together.events == one_by_one.events


def test_a_buffer_that_cannot_be_walked_in_a_join_loses_itself_only() -> None:
    cap = capture.read(DEFAULT_PATH / "torch_train.cupti")
    good = _pieces(cap, 4)
    torn = good[1][: len(good[1]) - 4]  # its last record cut short: it would run into the next buffer
    expected, got = Collect(), Collect()
    reference = _stream(cap, expected)
    for buffer in _buffers([good[0], good[2], good[3]]):
        reference.decode(*buffer)
    stream = _stream(cap, got)
    stream.decode_many(_buffers([good[0], torn, good[2], good[3]]))
    assert _encoded(got.events) == _encoded(expected.events)
    assert got.losses == [("cupti", "undecodable_buffer", 1, "buffers")]
    assert [message for _, message, _, _ in got.errors] == [
        f"records overrun the buffer: walked to {len(good[1])}, valid bytes {len(torn)}"
    ]
    assert stream.buffers == 4


def test_cupti_drop_counts_of_joined_buffers_are_reported_once_in_sum() -> None:
    cap = capture.read(DEFAULT_PATH / "exact_counts.cupti")
    pieces = _pieces(cap, 3)
    sink = Collect()
    _stream(cap, sink).decode_many([(memoryview(bytearray(p)), len(p), 5) for p in pieces])
    assert sink.losses == [("cupti", "cupti_buffer_dropped", 5 * len(pieces), "records")]


def test_the_walk_refuses_a_record_across_a_joined_end() -> None:
    cap = capture.read(DEFAULT_PATH / "exact_counts.cupti")
    first, second = _pieces(cap, 2)[:2]
    layouts = RecordLayouts(dict(cap.struct_sizes))
    data = join(_buffers([first, second]))
    found = walk(data, len(data), layouts, None, ends=[len(first)])
    assert sum(map(len, found.values())) == sum(
        len(o) for p in (first, second) for o in walk(memoryview(p), len(p), layouts, None).values()
    )
    with pytest.raises(LayoutError, match="records overrun the buffer"):
        walk(data, len(data), layouts, None, ends=[len(first) - 8])


def test_a_worker_decodes_several_slots_in_one_request_as_the_collector_would(tmp_path: Path) -> None:
    """``RemoteStream.decode_slots`` with several slots: one ``Decode`` naming them all (``more``),
    through a real worker process and real memfd slots."""
    from cuptistream.channel.shm import ACTIVITY, SlotPool
    from cuptistream.collector import worker_protocol as wp
    from cuptistream.collector.remote_stream import RemoteStream
    from cuptistream.collector.worker_pool import WorkerPool

    cap = capture.read(DEFAULT_PATH / "torch_train.cupti")
    pieces = _pieces(cap, 4)
    pool = SlotPool.create("joined", max(map(len, pieces)) + 8, len(pieces))
    workers = WorkerPool(1)
    requests: list[wp.Decode] = []
    try:
        link = workers.assign()
        assert link is not None
        link.map_pool(0, pool)
        real = link.decode
        link.decode = lambda request, replay: requests.append(request) or real(request, replay)  # type: ignore[method-assign,func-returns-value]
        remote_sink, local_sink = Collect(), Collect()
        info = OpenStream(
            stream=0, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings)
        )
        remote = RemoteStream(link, info, 0, remote_sink)
        slots = []
        for piece in pieces:
            slot = pool.take()
            assert slot is not None
            pool.view(slot)[: len(piece)] = piece
            pool.publish(slot, ACTIVITY, 0, len(piece))
            slots.append((slot, (pool.view(slot, len(piece)), len(piece), 0)))
        remote.decode_slots(0, slots)
        del slots
        remote.close()
        assert not link.broken, link.problem
        link.close()
    finally:
        workers.stop()
        pool.close()
    local = DecodeStream(info, 0, local_sink)
    local.decode_many(_buffers(pieces))
    local.close()
    assert len(requests) == 1 and len(requests[0].more) == len(pieces) - 1
    assert remote_sink.events and _encoded(remote_sink.events) == _encoded(local_sink.events)
    assert remote.buffers == len(pieces) and remote.records == local.records
    assert remote.decodes == local.decodes == 1  # the worker's count, as its reply carried it


def test_buffers_that_queue_up_on_a_connection_are_decoded_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay probe (a real process) publishes faster than an in-process collector decodes (each
    decode is the real one, held 30 ms longer): the buffers that queued up in the probe's slots
    are decoded together, never more than ``JOIN_BYTES`` at once, and every buffer is decoded once."""
    import time

    from cuptistream.collector import connection

    joined: list[tuple[int, int]] = []  # (buffers, bytes) per decode
    real = DecodeStream._decode

    def slow(
        self: DecodeStream, data: memoryview, valid: int, buffers: int, ends: list[int] | None = None
    ) -> bool:
        joined.append((buffers, valid))
        time.sleep(0.03)
        return real(self, data, valid, buffers, ends)

    monkeypatch.setattr(DecodeStream, "_decode", slow)
    path = DEFAULT_PATH / "exact_counts.cupti"
    report = run_replay_probes(tmp_path, {"decode_workers": 0}, path, loops=24)
    cap = capture.read(path)
    assert report.activity_buffers == 24 * len(cap.buffers) == sum(b for b, _ in joined)
    assert report.activity_records == 24 * sum(
        len(o)
        for b in cap.buffers
        for o in walk(memoryview(b.data), len(b.data), RecordLayouts(dict(cap.struct_sizes)), None).values()
    )
    assert max(b for b, _ in joined) > 1, joined  # some were decoded together
    assert report.activity_decodes == len(joined) < report.activity_buffers  # and reported so
    assert all(size <= connection.JOIN_BYTES for b, size in joined if b > 1)
