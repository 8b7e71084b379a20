"""One batch header: ``Batch``, ``EncodedBatch`` and the JSON Lines ``Envelope`` derive from
``BatchHeader`` and add only their own payload field, so a header field cannot be added to one and
missed in the others, and the wire order stays the header's."""

from __future__ import annotations

import msgspec
import pytest

from cuptistream.events import (
    HEADER_FIELDS,
    Batch,
    BatchHeader,
    ClockSync,
    EncodedBatch,
    NvtxMarker,
    Resource,
    header_fields,
)
from cuptistream.recording import codec, jsonl

# The wire order of the header (msgpack map and JSON object keys): changing it changes the bytes.
WIRE_HEADER = ("schema_version", "session_id", "seq", "resource", "attributes", "clock")

PAYLOAD = {Batch: ("events",), EncodedBatch: ("events",), jsonl.Envelope: ("event_count",)}


def test_header_fields_are_the_wire_order() -> None:
    assert HEADER_FIELDS == BatchHeader.__struct_fields__ == WIRE_HEADER


@pytest.mark.parametrize("cls", list(PAYLOAD), ids=lambda c: c.__name__)
def test_batch_kinds_are_the_header_plus_their_payload(cls: type[msgspec.Struct]) -> None:
    assert issubclass(cls, BatchHeader)
    assert cls.__struct_fields__ == (*HEADER_FIELDS, *PAYLOAD[cls]), (
        f"{cls.__name__} has fields beyond the shared BatchHeader and its payload; "
        "a header field belongs in BatchHeader"
    )


def _batch() -> Batch:
    resource = Resource(host="h", pid=1, process_name="p", command_line=["p"])
    return Batch(
        schema_version=1, session_id="s", seq=3, resource=resource,
        attributes={"k": "v"}, clock=ClockSync(cupti_ns=5, unix_ns=9), events=[],
    )  # fmt: skip


def test_the_three_carry_the_same_header_on_the_wire() -> None:
    batch = _batch()
    encoded = EncodedBatch(**header_fields(batch), events=msgspec.Raw(b"\x90"))
    assert codec.encode_batch(encoded, []) == codec.encode_batch_object(batch)
    assert codec.batch_with_events(encoded, []) == batch
    envelope_line = jsonl.encode_batch(batch).split(b"\n")[0]
    assert list(msgspec.json.decode(envelope_line)) == ["type", *HEADER_FIELDS, "event_count"]
    assert list(jsonl.iter_batches(jsonl.encode_batch(batch))) == [batch]


def test_a_batch_of_chunks_encodes_as_the_batch_of_their_events() -> None:
    """``encode_batch`` writes the header and then the chunks' events (one copy): the same bytes as
    encoding the whole Batch, for chunk sizes either side of msgpack's 16- and 65,536-element
    array headers."""
    for sizes in ([1], [7, 8], [20_000, 50_000]):
        events = [NvtxMarker(name=f"m{i}", timestamp=i, thread_id=1) for i in range(sum(sizes))]
        chunks, at = [], 0
        for n in sizes:
            chunks.append(codec.encode_chunk(events[at : at + n]))
            at += n
        batch = msgspec.structs.replace(_batch(), events=events)
        encoded = EncodedBatch(**header_fields(batch), events=msgspec.Raw(b"\x90"))
        data = codec.encode_batch(encoded, chunks)
        assert data == codec.encode_batch_object(batch)
        assert codec.decode_batch(data) == batch
        assert encoded.events == msgspec.Raw(b"\x90")  # left a valid (empty) array
