"""The columnar fast path decodes real CUPTI buffers to exactly the events of the per-record path."""

from __future__ import annotations

import collections

import msgspec
import pytest

from cuptistream.collector.buffer_decoder import Decoder
from cuptistream.cupti import capture
from cuptistream.cupti.names import TableNames
from cuptistream.cupti.records import RecordLayouts
from cuptistream.recording.codec import array_header, decode_events
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

    path = Path(__file__).resolve().parent / "fixtures" / "w3_stream.cupti"
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


def _w3() -> capture.Capture:
    from pathlib import Path

    return capture.read(Path(__file__).resolve().parent / "fixtures" / "w3_stream.cupti")


def _columns_decoder(cap: capture.Capture) -> Decoder:
    return Decoder(TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)), columns=True)


@pytest.mark.parametrize("name", [*sorted(p.name for p in CAPTURES.glob("*.cupti")), "w3"])
def test_columns_expand_to_exactly_the_packed_elements(name: str) -> None:
    """A ``Columns`` element expands, byte for byte, into what the map packer writes for the same
    records, and it is one msgpack element that stands for ``count`` events."""
    from cuptistream.cupti.columnar import expand
    from cuptistream.events import Columns
    from cuptistream.recording.codec import has_columns

    cap = _w3() if name == "w3" else capture.read(CAPTURES / name)
    maps, columns = _decoder(cap), _columns_decoder(cap)
    seen_columns = 0
    for buf in cap.buffers:
        packed = maps.decode_packed(buf.data, len(buf.data))
        expected = [bytes(c.payload) for c in packed]
        got = []
        for chunk, as_maps in zip(columns.decode_packed(buf.data, len(buf.data)), packed, strict=True):
            if has_columns(chunk.payload):
                assert chunk.elements == 1
                seen_columns += 1
                element = msgspec.msgpack.decode(bytes(chunk.payload), type=Columns)
                assert element.rows == chunk.count
                got.append(bytes(expand(element)))
            else:
                assert chunk.elements == chunk.count
                got.append(bytes(chunk.payload))
            # and as a reader sees it: only fields that are not zero in every row are expanded
            events = decode_events(array_header(chunk.elements) + bytes(chunk.payload))
            assert events == decode_events(array_header(as_maps.count) + bytes(as_maps.payload))
        assert got == expected
    assert seen_columns > 0


def test_columns_keep_every_integer_bit_for_bit() -> None:
    """Differences between rows wrap modulo 2**64: unsigned 64-bit values past 2**63, values that
    go down, and narrow signed columns come back as the map packer writes them."""
    import numpy as np

    from cuptistream.cupti import columnar
    from cuptistream.events import Columns

    rng = np.random.default_rng(5)
    count = 3000
    ints = {
        "a": rng.integers(0, 2**64 - 1, count, dtype=np.uint64, endpoint=True),
        "b": rng.integers(-(2**31), 2**31 - 1, count, dtype=np.int64).astype(np.int32),
        "c": rng.integers(0, 2**32 - 1, count, dtype=np.uint64).astype(np.uint32),
    }
    triples = {"t": (np.arange(count)[::-1], np.zeros(count, np.uint8), rng.integers(-5, 5, count))}
    groups = rng.integers(0, 70_000, count)  # more groups than 2 bytes a row can name
    strings = [(f"g{g}",) for g in range(70_000)]
    packer = columnar.Packer("x", ["a", "b", "c"], triples=["t"], strings=["s"])
    maps = bytes(packer.pack(ints, triples, groups, strings))
    element = msgspec.msgpack.decode(bytes(packer.pack_columns(ints, triples, groups, strings)), type=Columns)
    assert element.rows == count
    assert bytes(columnar.expand(element)) == maps
    # A reader that reads a few fields gets those, as the maps would have given them.
    few = msgspec.msgpack.decode(array_header(count) + bytes(columnar.expand(element, {"a", "s"})))
    full = msgspec.msgpack.decode(array_header(count) + maps)
    assert few == [{"type": "x", "a": e["a"], "s": e["s"]} for e in full]


def test_a_damaged_columns_element_is_refused_not_expanded_wrong() -> None:
    """Sizes that do not add up (rows, values, groups) raise ``ValidationError``, which the readers
    count as a damaged frame."""
    import numpy as np

    from cuptistream.cupti import columnar
    from cuptistream.events import Columns
    from cuptistream.recording.codec import decode_events

    packer = columnar.Packer("kernel", ["start"], strings=["name"])
    good = msgspec.msgpack.decode(
        bytes(packer.pack_columns({"start": np.arange(4)}, {}, np.zeros(4, np.intp), [("k",)])), type=Columns
    )
    bad = [
        msgspec.structs.replace(good, rows=5),
        msgspec.structs.replace(good, values=good.values[:-8]),
        msgspec.structs.replace(good, counts=[3]),
        msgspec.structs.replace(good, counts=[5, -1], groups=[["k"], ["j"]]),
        msgspec.structs.replace(good, groups=[["k", "extra"]]),
    ]
    for element in bad:
        with pytest.raises(msgspec.ValidationError):
            decode_events(array_header(1) + msgspec.msgpack.encode(element))


def test_sinks_that_ship_batches_to_other_programs_get_one_element_per_event(tmp_path) -> None:
    """The file sink's msgpack (and the null sink) take columns; its JSON Lines, stdout, Kafka and
    OTLP get the events as maps. The pipeline writes columns only when every sink takes them."""
    from cuptistream.config.model import load

    cases = {
        "file": ([{"type": "file", "directory": str(tmp_path)}], True),
        "jsonl": ([{"type": "file", "directory": str(tmp_path), "format": "jsonl"}], False),
        "null": ([{"type": "null"}], True),
        "stdout": ([{"type": "stdout"}], False),
        "file+kafka": (
            [
                {"type": "file", "directory": str(tmp_path)},
                {"type": "kafka", "bootstrap_servers": ["127.0.0.1:1"]},
            ],
            False,
        ),
        "otlp": ([{"type": "otlp", "endpoint": "http://127.0.0.1:1"}], False),
    }
    for name, (sinks, expected) in cases.items():
        built = [sink_class(c) for c, sink_class in load({"sinks": sinks}).enabled_sinks()]
        assert all(isinstance(s.accepts_columns, bool) for s in built)
        assert all(s.accepts_columns for s in built) is expected, name
