"""The collector's front door (``cuptistream.collector.shedding``): while nothing downstream has room,
whole activity buffers are counted by records and not decoded; under ``block``, or while a lane has
room, nothing is shed. Real pipelines (null sinks) and a real GPU capture (H200)."""

from __future__ import annotations

from typing import Any

import trio

import cuptistream
from cuptistream.collector import shedding
from cuptistream.collector.buffer_decoder import Decoder
from cuptistream.collector.collector import Collector
from cuptistream.cupti import capture
from cuptistream.cupti.names import TableNames
from cuptistream.cupti.records import RecordLayouts
from cuptistream.recording.codec import Chunk
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES
from tests.replay_probes import run_replay_probes

MIB = 1 << 20


def _collector(
    policy: str = "drop_newest", lane_policy: str = "drop_newest", sinks: int = 1, lane_bytes: str = "1MiB"
) -> Collector:
    null: dict[str, Any] = {"type": "null", "queue": {"max_bytes": lane_bytes, "full_policy": lane_policy}}
    config = cuptistream.load_config(
        {
            "pipeline": {"memory_budget": "1MiB", "full_policy": policy},
            "sources": [],
            "sinks": [{**null, "name": f"n{i}"} for i in range(sinks)],
        }
    )
    return Collector(config)  # not started: the lanes keep what is offered


def _fill_lane(collector: Collector, index: int, nbytes: int) -> None:
    trio.run(collector.pipeline.lanes[index].offer, Chunk(b"\0" * nbytes, 1))


def _waits_until_one_is_decoded(
    door: shedding.FrontDoor, data: memoryview, layouts: RecordLayouts, intake: Any, why: str
) -> None:
    """``admit`` of ``data`` blocks (``why``) until one buffer in flight is decoded, then admits it
    with nothing shed."""
    import threading

    results: list[bool] = []
    waiting = threading.Thread(target=lambda: results.append(door.admit(data, len(data), 0, layouts, intake)))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and not results, why
    door.decoded(len(data))
    waiting.join(5)
    assert results == [True] and not intake.losses, "one was decoded: admitted, nothing shed"


def test_full_intake_sheds_under_drop_newest_only() -> None:
    for policy, sheds in [("drop_newest", True), ("drop_oldest", False), ("block", False)]:
        collector = _collector(policy, lane_bytes="64MiB")  # the lane has room: only the intake decides
        assert not shedding.overloaded(collector.pipeline)
        collector.pipeline.intake.emit_chunk(Chunk(b"\0" * MIB, 1))  # an empty intake takes one chunk
        assert shedding.overloaded(collector.pipeline) is sheds, policy


def test_sheds_only_while_every_running_lane_is_saturated() -> None:
    collector = _collector(sinks=2)
    _fill_lane(collector, 0, MIB)
    assert collector.pipeline.lanes[0].saturated()
    assert not shedding.overloaded(collector.pipeline), "the second lane still has room"
    _fill_lane(collector, 1, MIB - MIB // 32)  # within a sixteenth of full
    assert shedding.overloaded(collector.pipeline)
    collector.pipeline.lanes[1].stop("auth_failed")  # a stopped lane is not waited for
    assert shedding.overloaded(collector.pipeline)


def test_the_intake_backlog_counts_against_every_lane() -> None:
    collector = _collector(policy="drop_oldest")  # a full intake alone does not shed
    _fill_lane(collector, 0, MIB // 2)
    assert not shedding.overloaded(collector.pipeline)
    collector.pipeline.intake.emit_chunk(Chunk(b"\0" * (MIB // 2), 1))  # decoded, on its way to the lane
    assert collector.pipeline.lanes[0].saturated(collector.pipeline.intake.queued_bytes)
    assert shedding.overloaded(collector.pipeline)


def test_a_blocking_lane_is_never_saturated() -> None:
    collector = _collector(lane_policy="block")
    _fill_lane(collector, 0, 2 * MIB)  # one chunk always fits an empty lane
    assert not collector.pipeline.lanes[0].saturated()
    assert not shedding.overloaded(collector.pipeline)


def test_shed_buffer_is_counted_by_records_without_events() -> None:
    cap = capture.read(CAPTURES / "exact_counts.cupti")
    decoder = Decoder(TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)))
    collector = _collector()
    intake = collector.pipeline.intake
    total = 0
    for buf in cap.buffers:
        data = memoryview(bytearray(buf.data))
        assert shedding.shed(data, len(buf.data), 3, decoder.layouts, intake)
        before = decoder.records_decoded
        decoder.decode_packed(data, len(buf.data))  # the independent count: what decoding walks
        total += decoder.records_decoded - before
    assert total > 1000
    assert intake.losses[shedding.STAGE, shedding.REASON, "records"] == total
    assert intake.losses["cupti", "cupti_buffer_dropped", "records"] == 3 * len(cap.buffers)
    assert intake.events_in == 0, "a shed buffer never becomes events"


def test_unknown_record_size_is_decoded_not_guessed() -> None:
    cap = capture.read(CAPTURES / "exact_counts.cupti")
    collector = _collector()
    data = memoryview(bytearray(cap.buffers[0].data))
    assert not shedding.shed(data, len(data), 0, RecordLayouts({}), collector.pipeline.intake)
    assert not collector.pipeline.intake.losses


def test_front_door_decodes_when_there_is_room_and_sheds_one_connection_at_a_time() -> None:
    import threading

    cap = capture.read(CAPTURES / "exact_counts.cupti")
    layouts = RecordLayouts(dict(cap.struct_sizes))
    data = memoryview(bytearray(cap.buffers[0].data))
    collector = _collector()
    door = shedding.FrontDoor(collector.pipeline)
    intake = collector.pipeline.intake
    assert door.admit(data, len(data), 0, layouts, intake), "room: decode"
    _fill_lane(collector, 0, MIB)
    results: list[bool] = []
    with door._gate:  # another connection is shedding: this one waits, off the GIL
        waiter = threading.Thread(
            target=lambda: results.append(door.admit(data, len(data), 0, layouts, intake))
        )
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive() and not results
    waiter.join(5)
    assert results == [False]
    assert intake.losses[shedding.STAGE, shedding.REASON, "records"] > 0


def test_buffers_being_decoded_count_against_the_lanes() -> None:
    """Each admitted buffer reserves ``RESERVE_PER_BYTE`` times its bytes until ``decoded``: with
    decode workers several are decoded at once, and the lanes must have room for all their events
    (without this, many programs under one collector drop events after decoding them). A buffer that
    only those in flight leave without room waits for one to be decoded, and is then admitted, not
    shed. Its own events are not counted against it: an idle pipeline admits one of any size."""

    cap = capture.read(CAPTURES / "exact_counts.cupti")
    layouts = RecordLayouts(dict(cap.struct_sizes))
    one = bytes(cap.buffers[0].data)
    data = memoryview(bytearray(one * (1 + MIB // len(one))))  # ~1 MiB: reserves ~3 MiB
    collector = _collector(policy="drop_oldest", lane_bytes="4MiB")  # the lane decides: room 3.75 MiB
    door = shedding.FrontDoor(collector.pipeline)
    intake = collector.pipeline.intake
    assert door.admit(data, len(data), 0, layouts, intake)
    assert door.in_flight == shedding.RESERVE_PER_BYTE * len(data)
    assert door.admit(data, len(data), 0, layouts, intake), "3 MiB on their way: room for more"
    _waits_until_one_is_decoded(door, data, layouts, intake, "6 MiB on their way: it waits for them")
    assert door.in_flight == 2 * shedding.RESERVE_PER_BYTE * len(data)
    door.decoded(len(data))
    door.decoded(len(data))
    huge = memoryview(bytearray(one * (1 + 4 * MIB // len(one))))  # its own 12 MiB exceed the lane
    assert door.admit(huge, len(huge), 0, layouts, intake), "an idle pipeline admits any buffer"
    door.decoded(len(huge))
    assert door.in_flight == 0
    # Under drop_newest the memory budget counts them too.
    budgeted = _collector(lane_bytes="64MiB")
    assert not shedding.overloaded(budgeted.pipeline)
    assert shedding.overloaded(budgeted.pipeline, in_flight=budgeted.pipeline.intake.budget_bytes)


def test_counting_a_shed_buffer_agrees_with_the_walk_on_every_capture() -> None:
    """``count_records`` (a step per record, nothing kept) counts what ``records.walk`` finds, and
    gives up (None: decode it instead) on an unknown kind or records that overrun the buffer."""
    from cuptistream.cupti.records import walk

    for path in sorted(CAPTURES.glob("*.cupti")):
        cap = capture.read(path)
        layouts = RecordLayouts(dict(cap.struct_sizes))
        for buffer in cap.buffers:
            data = memoryview(bytearray(buffer.data))
            found = walk(data, len(data), layouts, None)
            assert shedding.count_records(data, len(data), layouts) == sum(map(len, found.values()))
            assert shedding.count_records(data, len(data) - 8, layouts) is None  # the last record overruns
        assert shedding.count_records(data, len(data), RecordLayouts({})) is None


def test_a_large_buffer_waits_longer_before_it_is_shed() -> None:
    """The pause before shedding grows with the buffer (``PAUSE_PER_BYTES``): counting a shed
    buffer's records costs per record, so shedding is capped in bytes per second."""
    import time

    cap = capture.read(CAPTURES / "exact_counts.cupti")
    layouts = RecordLayouts(dict(cap.struct_sizes))
    one = bytes(cap.buffers[0].data)
    big = memoryview(bytearray(one * (1 + 4 * shedding.PAUSE_PER_BYTES // len(one))))
    collector = _collector()
    door = shedding.FrontDoor(collector.pipeline)
    intake = collector.pipeline.intake
    _fill_lane(collector, 0, MIB)
    started = time.monotonic()
    assert not door.admit(big, len(big), 0, layouts, intake)
    assert time.monotonic() - started >= 4 * shedding.PAUSE_S
    copies = len(big) // len(one)
    records = shedding.count_records(memoryview(bytearray(one)), len(one), layouts)
    assert records is not None
    assert intake.losses[shedding.STAGE, shedding.REASON, "records"] == copies * records


def test_buffers_decoded_in_the_collectors_threads_are_decoded_one_at_a_time(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """Three replay probes (real processes) send their buffers to an in-process collector with no
    decode worker: their connection threads take turns, so no two buffers are ever decoded at once,
    and every buffer is decoded. The decode itself is the real one, timed around."""
    import threading
    import time

    from cuptistream.collector.decoding import DecodeStream

    inside, most, decoded = [0], [0], [0]
    lock = threading.Lock()
    real_decode = DecodeStream._decode  # every decode, of one buffer or of several joined

    def timed_decode(
        self: DecodeStream, view: memoryview, valid: int, buffers: int, ends: list[int] | None = None
    ) -> bool:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            time.sleep(0.002)  # long enough for the other connections to arrive meanwhile
            return real_decode(self, view, valid, buffers, ends)
        finally:
            with lock:
                inside[0] -= 1
                decoded[0] += buffers

    monkeypatch.setattr(DecodeStream, "_decode", timed_decode)
    path = CAPTURES / "exact_counts.cupti"
    report = run_replay_probes(
        tmp_path, {"decode_workers": 0, "full_policy": "block"}, path, loops=3, probes=3
    )
    buffers = len(capture.read(path).buffers)
    assert decoded[0] == report.activity_buffers == 3 * 3 * buffers
    assert most[0] == 1, f"{most[0]} buffers were decoded at once"


def test_under_block_a_buffer_waits_while_those_being_decoded_fill_the_budget() -> None:
    """Under ``block`` nothing is shed, but a buffer whose events, with those of the buffers being
    decoded, would pass the memory budget waits in its slot until one is decoded: each connection
    blocked in the intake held its decoded buffer (16 probes: 593-655 MiB at a 256 MiB budget).
    With none being decoded a buffer goes at once, whatever its size."""

    cap = capture.read(CAPTURES / "exact_counts.cupti")
    layouts = RecordLayouts(dict(cap.struct_sizes))
    one = bytes(cap.buffers[0].data)
    data = memoryview(bytearray(one * 2))  # ~330 KiB: reserves ~1 MiB, the whole 1 MiB budget
    collector = _collector(policy="block", lane_bytes="64MiB")
    door = shedding.FrontDoor(collector.pipeline)
    intake = collector.pipeline.intake
    assert door.admit(data, len(data), 0, layouts, intake), "nothing in flight: it goes"
    _waits_until_one_is_decoded(
        door, data, layouts, intake, "the first one's events fill the budget: it waits"
    )
    door.decoded(len(data))
    assert door.in_flight == 0
