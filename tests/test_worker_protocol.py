"""The decode worker's wire (``collector.worker_protocol``) over a real ``SOCK_SEQPACKET`` pair:
messages of many fragments arrive whole, a file descriptor travels with its request, a reply's
chunk payloads are views into the received message (no copy under the collector's GIL), and a
sender that dies mid-message is end of stream, not a hang or a half message."""

from __future__ import annotations

import os
import threading

import pytest

from cuptistream.collector import worker_protocol as wp


@pytest.mark.parametrize("big", [3 * 1024 * 1024 + 17, 1000])  # ~24 fragments, or one datagram
def test_a_reply_arrives_whole_with_its_chunks_as_views(big: int) -> None:
    ours, theirs = wp.pair()
    payloads = [os.urandom(big), b"", os.urandom(70_000 if big > 1000 else 500)]
    reply = wp.Reply(
        calls=[wp.EmitChunk(memoryview(p), i, i) for i, p in enumerate(payloads)]
        + [wp.ReportLoss("cupti", "cupti_buffer_dropped", 5, "records")],
        buffers=3, records=1234,
    )  # fmt: skip
    sender = threading.Thread(target=wp.send_reply, args=(theirs, reply))
    sender.start()
    got = wp.receive_reply(ours)
    sender.join()
    assert got is not None and got.records == 1234 and got.buffers == 3
    chunks = [c for c in got.calls if isinstance(c, wp.EmitChunk)]
    assert [bytes(c.payload) for c in chunks] == payloads and [c.count for c in chunks] == [0, 1, 2]
    assert all(c.payload.obj is chunks[0].payload.obj for c in chunks)  # views into one received buffer
    assert got.calls[-1] == wp.ReportLoss("cupti", "cupti_buffer_dropped", 5, "records")
    for end in (ours, theirs):
        end.close()


def test_a_request_brings_its_file_descriptor_and_a_short_one_is_one_datagram() -> None:
    ours, theirs = wp.pair()
    read_end, write_end = os.pipe()
    wp.send_request(ours, wp.MapPool(pool=2, slot_size=4096, slots=8), [read_end])
    got = wp.receive_request(theirs)
    assert got is not None
    request, fds = got
    assert request == wp.MapPool(pool=2, slot_size=4096, slots=8) and len(fds) == 1
    os.write(write_end, b"ok")
    assert os.read(fds[0], 2) == b"ok"  # the same pipe, received as a new descriptor
    for fd in (read_end, write_end, fds[0]):
        os.close(fd)
    for end in (ours, theirs):
        end.close()


def test_a_sender_gone_mid_message_is_end_of_stream() -> None:
    ours, theirs = wp.pair()
    data = b"\x00" * (5 * 128 * 1024)
    lead = wp._MORE + wp._LENGTHS.pack(len(data), 100)
    theirs.sendmsg([lead, data[: 128 * 1024]])  # the first of five fragments, then the worker dies
    theirs.close()
    assert wp.receive_reply(ours) is None
    ours.close()
