"""Columns elements built straight into Structs (``column_structs``) equal what decoding the maps
``cupti.columnar.expand`` packs gives (``codec._expand_as_maps``, the fallback), for every reader's
Structs, on real captures and on edge cases."""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec
import numpy as np
import pytest

from cuptistream.analysis import compare_read, records
from cuptistream.collector.buffer_decoder import Decoder
from cuptistream.cupti import capture, columnar
from cuptistream.cupti.names import TableNames
from cuptistream.cupti.records import RecordLayouts
from cuptistream.events import Columns, NvtxMarker
from cuptistream.recording import codec
from cuptistream.recording.column_structs import build
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES  # shipped real-GPU captures

# The full schema (``recording.read``), the analysis views', the summary's, the comparison's.
DECODERS = {
    "events": codec._events_decoder,
    "light": records._light_events,
    "summary": records._lean_events,
    "compare": compare_read.DECODER,
}


def _both_ways(element: Columns, decoder: msgspec.msgpack.Decoder[Any]) -> tuple[list[Any], list[Any]]:
    """``element``'s events built from the columns (which must be possible), and decoded from maps."""
    cls = codec._classes(decoder)[element.event]
    built = build(element, cls)
    assert built is not None, f"{cls.__name__} not built from columns"
    return built, codec._expand_as_maps(element, decoder)


def _columns_from_captures() -> list[Columns]:
    elements = []
    for path in sorted(CAPTURES.glob("*.cupti")):
        cap = capture.read(path)
        decoder = Decoder(TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)), columns=True)
        for buf in cap.buffers:
            for chunk in decoder.decode_packed(buf.data, len(buf.data)):
                if codec.has_columns(chunk.payload):
                    elements.append(msgspec.msgpack.decode(bytes(chunk.payload), type=Columns))
    return elements


@pytest.mark.parametrize("name", DECODERS)
def test_captured_columns_build_the_structs_their_maps_decode_to(name: str) -> None:
    decoder = DECODERS[name]
    elements = _columns_from_captures()
    assert {e.event for e in elements} >= {"kernel", "api", "memcpy"}
    for element in elements:
        built, decoded = _both_ways(element, decoder)
        assert len(built) == element.rows
        assert built == decoded
        # and through the readers' entry point, around events that are not columns
        (other,) = decoder.decode(msgspec.msgpack.encode([NvtxMarker(name="m", timestamp=1, thread_id=2)]))
        assert codec.expand_columns([other, element, other], decoder) == [other, *decoded, other]


class X(msgspec.Struct, tag_field="type", tag="x"):
    a: int
    b: int
    t: tuple[int, int, int]
    s: str
    u: str | None = None
    absent: int = 7  # not in the element: its default in every row
    gone: str | None = None


def _element(ints: dict[str, Any], groups: Any, strings: list[tuple[str, str]]) -> Columns:
    packer = columnar.Packer("x", ["a", "b"], triples=["t"], strings=["s", "u"])
    count = len(groups)
    triples = {"t": (ints.pop("t0"), np.zeros(count, np.int64), np.full(count, 3))}
    payload = packer.pack_columns(ints, triples, np.asarray(groups, np.intp), strings)
    return msgspec.msgpack.decode(bytes(payload), type=Columns)


_X = msgspec.msgpack.Decoder(list[X])


def test_a_field_zero_in_every_row_a_single_row_and_many_groups() -> None:
    rng = np.random.default_rng(7)
    cases = {
        "zero": (
            {"a": np.zeros(50, np.int64), "b": np.arange(50), "t0": np.zeros(50, np.int64)},
            rng.integers(0, 3, 50),
        ),
        "one row": ({"a": np.array([-5]), "b": np.array([2**62]), "t0": np.array([9])}, [0]),
        "many groups": (
            {"a": rng.integers(-(2**40), 2**40, 5000), "b": np.full(5000, 4), "t0": rng.integers(0, 9, 5000)},
            rng.integers(0, 3000, 5000),
        ),
    }
    for name, (ints, groups) in cases.items():
        strings = [(f"s{g}", f"u{g % 7}") for g in range(max(groups) + 1)]
        element = _element(ints, groups, strings)
        built, decoded = _both_ways(element, _X)
        assert built == decoded, name
        assert all(e.absent == 7 and e.gone is None for e in built)
        if name == "zero":
            assert {e.a for e in built} == {0} and {e.t for e in built} == {(0, 0, 3)}
        if name == "many groups":
            assert len(element.groups) > 2000


def test_deltas_that_wrap_give_the_int64_values_the_maps_give() -> None:
    """Unsigned 64-bit values past 2**63 (stored as int64, as the maps hold them), and jumps between
    the int64 extremes: row sums past the int64 range wrap exactly as the writer's did."""
    a = np.array([2**63 - 2, 2**63 + 1, 5, 2**64 - 1, 0, 2**63, 2**63 - 1, 1], np.uint64)
    b = np.array([-(2**63), 2**63 - 1, -(2**63), 0, 2**63 - 1, -1, -(2**63), 2**63 - 1], np.int64)
    element = _element({"a": a, "b": b, "t0": b[::-1].copy()}, [0, 1] * 4, [("p", "q"), ("r", "s")])
    built, decoded = _both_ways(element, _X)
    assert built == decoded
    order = [0, 2, 4, 6, 1, 3, 5, 7]  # group 0's rows first
    assert [e.a for e in built] == [int(v) for v in a.astype(np.int64)[order]]
    assert [e.b for e in built] == [int(v) for v in b[order]]


class Constrained(msgspec.Struct, tag_field="type", tag="x"):
    a: Annotated[int, msgspec.Meta(ge=0)]  # decoding checks it, construction would not
    b: int
    t: tuple[int, int, int]
    s: str


class KeywordOnly(msgspec.Struct, tag_field="type", tag="x", kw_only=True):
    a: int
    s: str


class Floats(msgspec.Struct, tag_field="type", tag="x"):
    a: float  # decoding an integer into it gives a float
    s: str


class Required(msgspec.Struct, tag_field="type", tag="x"):
    a: int
    missing: int  # not in the element: decoding refuses it


@pytest.mark.parametrize("cls", [Constrained, KeywordOnly, Floats, Required])
def test_structs_not_built_exactly_from_columns_are_decoded_from_maps(cls: type) -> None:
    element = _element(
        {"a": np.array([1, -2, 3]), "b": np.arange(3), "t0": np.arange(3)},
        [0, 0, 1],
        [("p", "q"), ("r", "s")],
    )
    assert build(element, cls) is None
    decoder = msgspec.msgpack.Decoder(list[Union[cls, records.LKernel]])  # type: ignore[valid-type]  # noqa: UP007
    if cls in (Constrained, Required):  # refused as the maps always were
        with pytest.raises(msgspec.ValidationError):
            codec.expand_columns([element], decoder)
    else:
        assert codec.expand_columns([element], decoder) == codec._expand_as_maps(element, decoder)
        assert [e.a for e in codec.expand_columns([element], decoder)] == [1, -2, 3]


@pytest.mark.parametrize("name", DECODERS)
def test_a_damaged_element_raises_validation_error_for_every_reader(name: str) -> None:
    element = _columns_from_captures()[0]
    bad = [
        msgspec.structs.replace(element, rows=element.rows + 1),
        msgspec.structs.replace(element, values=element.values[:-8]),
        msgspec.structs.replace(element, counts=[*element.counts[:-1], element.counts[-1] + 1]),
        msgspec.structs.replace(element, groups=[[*texts, "extra"] for texts in element.groups]),
    ]
    for damaged in bad:
        with pytest.raises(msgspec.ValidationError):
            codec.decode_expanding(codec.array_header(1) + msgspec.msgpack.encode(damaged), DECODERS[name])
