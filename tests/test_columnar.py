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


def test_w3s_own_gpu_sized_buffers_pack_to_the_per_record_events() -> None:
    """W3's 4 MiB H100 buffers: ~19k kernels a buffer, many fill blocks (``columnar._BLOCK``)."""
    from pathlib import Path

    path = (
        Path(__file__).resolve().parents[1]
        / "bench/results/2026-11-27f-h100/gpu-capture-stream/w3_stream.cupti"
    )
    cap = capture.read(path)
    slow, fast = _decoder(cap), _decoder(cap)
    for buf in cap.buffers:
        expected = collections.Counter(
            msgspec.msgpack.encode(e) for e in slow.decode(buf.data, len(buf.data))
        )
        got: collections.Counter[bytes] = collections.Counter()
        for chunk in fast.decode_packed(buf.data, len(buf.data)):
            got.update(
                msgspec.msgpack.encode(e) for e in decode_events(array_header(chunk.count) + chunk.payload)
            )
        assert got == expected


def test_groups_that_straddle_fill_blocks_keep_every_record_its_own_strings() -> None:
    """Records of 7 string groups in random order, 3.5 fill blocks of them: each element decodes to
    its own record's integers and its group's strings, groups in order, records in order within."""
    import numpy as np

    from cuptistream.cupti import columnar

    rng = np.random.default_rng(3)
    count = int(columnar._BLOCK * 3.5)
    groups = rng.integers(0, 7, count)
    groups[groups == 5] = 6  # one group with no records
    ints = {"a": rng.integers(-(2**62), 2**62, count), "b": np.arange(count)}
    triples = {"t": (rng.integers(0, 9, count), rng.integers(0, 9, count), np.zeros(count, dtype=np.int64))}
    strings = [(f"name-{g}" * (g + 1), f"k{g}") for g in range(7)]  # suffixes of different lengths
    packer = columnar.Packer("x", ["a", "b"], triples=["t"], strings=["s1", "s2"])
    payload = bytes(packer.pack(ints, triples, groups, strings))
    elements = msgspec.msgpack.decode(array_header(count) + payload)
    order = np.argsort(groups, kind="stable")
    expected = [
        {"type": "x", "a": int(ints["a"][i]), "b": int(ints["b"][i]),
         "t": [int(part[i]) for part in triples["t"]], "s1": strings[groups[i]][0], "s2": strings[groups[i]][1]}
        for i in order
    ]  # fmt: skip
    assert elements == expected
