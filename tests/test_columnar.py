"""The columnar fast path decodes real CUPTI buffers to exactly the events of the per-record path."""

from __future__ import annotations

import collections

import msgspec
import pytest

from cuptistream.codec import array_header, decode_events
from cuptistream.cupti import capture
from cuptistream.cupti.decode import Decoder
from cuptistream.cupti.names import TableNames
from cuptistream.cupti.records import RecordLayouts
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES  # shipped real-GPU captures


def _decoder(cap: capture.Capture, demangle: bool = False) -> Decoder:
    return Decoder(TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)), demangle)


@pytest.mark.parametrize("name", sorted(p.name for p in CAPTURES.glob("*.cupti")))
@pytest.mark.parametrize("demangle", [False, True])
def test_packed_events_equal_the_per_record_events(name: str, demangle: bool) -> None:
    cap = capture.read(CAPTURES / name)
    slow, fast = _decoder(cap, demangle), _decoder(cap, demangle)
    expected: collections.Counter[bytes] = collections.Counter()
    got: collections.Counter[bytes] = collections.Counter()
    packed_kinds = set()
    for buf in cap.buffers:
        for event in slow.decode(buf.data, len(buf.data)):
            expected[msgspec.msgpack.encode(event)] += 1
        for chunk in fast.decode_packed(buf.data, len(buf.data)):
            events = decode_events(array_header(chunk.count) + chunk.payload)
            assert len(events) == chunk.count
            packed_kinds.update(type(e).__name__ for e in events)
            got.update(msgspec.msgpack.encode(e) for e in events)  # canonical re-encoding
    assert got == expected
    assert sum(expected.values()) > 0
    assert fast.records_decoded == slow.records_decoded
    assert packed_kinds & {"Kernel", "ApiCall", "Memcpy", "Memset"}
