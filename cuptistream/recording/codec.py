"""msgpack encoding of events and batches.

Sources hand over *chunks*: lists of events encoded once, on the source's thread, into msgpack.
A chunk's byte length is what the pipeline's memory budget counts, exactly. A batch is assembled
from chunks without re-encoding: the chunks' array headers are stripped and one header for the
whole batch is written in front of the concatenated elements (``msgspec.Raw``).
"""

from __future__ import annotations

import functools
import re
import struct
import typing
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Union

import msgspec

from cuptistream.events import AnyEvent, Batch, BatchHeader, Columns, EncodedBatch, Event, header_fields
from cuptistream.recording import column_structs

if TYPE_CHECKING:
    from cuptistream.recording.producers import Producer

_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(Batch)
_events_decoder = msgspec.msgpack.Decoder(list[AnyEvent])
_json_encoder = msgspec.json.Encoder()
# How a ``Columns`` element begins after its map header: its ``type`` key and tag. Batches without
# it (every one but the file sink's hot kinds) cost one scan for it, no decoding.
_COLUMNS_TAG = b"\xa4type\xa7columns"
_has_columns = re.compile(re.escape(_COLUMNS_TAG)).search


class _StoredBatch(BatchHeader, kw_only=True):
    """A batch as the file sink may store it: events and ``Columns`` elements."""

    events: list[Union[AnyEvent, Columns]]  # noqa: UP007 - msgspec needs a real Union


_stored_batch_decoder = msgspec.msgpack.Decoder(_StoredBatch)


class ChunkGroup:
    """Chunks that are views into one block of memory of ``nbytes`` (a decode worker's reply): the
    block lives, whole, until the last of them is let go, so the memory budget counts all of it
    from the first chunk in to the last one out (``Intake``). ``members``: chunks not yet gone."""

    __slots__ = ("charged", "members", "nbytes")

    def __init__(self, members: int, nbytes: int) -> None:
        self.members = members
        self.nbytes = nbytes
        self.charged = False  # the intake counts the block


class Chunk:
    """Events from one hand-off: their msgpack elements (without the array header) and count, and
    the process they came from (``producer``; None: the collector's own). ``payload`` is bytes, or
    a view into a decode worker's reply (``collector.worker_protocol``), which it keeps alive: the
    reply's chunks then share a ``group``. ``elements``: how many msgpack elements the payload
    holds, when not one per event (an ``events.Columns`` element holds many events)."""

    __slots__ = ("count", "elements", "group", "holders", "payload", "producer", "seq")

    def __init__(
        self,
        payload: bytes | memoryview,
        count: int,
        producer: Producer | None = None,
        group: ChunkGroup | None = None,
        elements: int | None = None,
    ) -> None:
        self.payload = payload
        self.count = count
        self.elements = count if elements is None else elements
        self.producer = producer
        self.group = group
        self.seq = 0  # the intake's number for it, from 1 (0: none, e.g. control events)
        # Lanes that have yet to let go of it (``Intake.take``); the last one returns its bytes to
        # the pipeline's memory budget. 0: outside the budget (control and accounting chunks).
        self.holders = 0

    @property
    def nbytes(self) -> int:
        return len(self.payload)


def _array_header_length(first_byte: int) -> int:
    if first_byte & 0xF0 == 0x90:
        return 1  # fixarray
    if first_byte == 0xDC:
        return 3  # array 16
    if first_byte == 0xDD:
        return 5  # array 32
    raise ValueError(f"not a msgpack array header: {first_byte:#x}")


def array_header(count: int) -> bytes:
    if count < 16:
        return bytes((0x90 | count,))
    if count < 0x10000:
        return b"\xdc" + struct.pack(">H", count)
    return b"\xdd" + struct.pack(">I", count)


def encode_chunk(events: Sequence[Event]) -> Chunk:
    """Encode a list of events once. Called on the emitting thread."""
    encoded = _encoder.encode(events)
    return Chunk(encoded[_array_header_length(encoded[0]) :], len(events))


# ``events`` is EncodedBatch's last field, so a batch is its header encoded with no events value,
# then the events array: one copy of the payloads. (Encoding them inside the header as a Raw cost
# 350 us per 480 KB batch, against 13 us this way: msgspec grows its buffer for the Raw.)
assert EncodedBatch.__struct_fields__[-1] == "events"


def encode_batch(header: EncodedBatch, chunks: Iterable[Chunk]) -> bytes:
    """Encode a batch whose ``events`` field is filled from ``chunks``. ``header.events`` is
    ignored, and left as an empty array."""
    return b"".join(encode_batch_parts(header, chunks))


def encode_batch_parts(header: EncodedBatch, chunks: Iterable[Chunk]) -> list[bytes | memoryview]:
    """``encode_batch`` in pieces whose concatenation is the batch: the chunks' payloads are not
    copied (a sink that can take pieces, the file sink's zstd, reads them where they lie)."""
    parts = list(chunks)
    count = sum(c.elements for c in parts)
    header.events = msgspec.Raw(b"")
    head = _encoder.encode(header)
    header.events = msgspec.Raw(b"\x90")
    return [head, array_header(count), *(c.payload for c in parts)]


def batch_with_events(header: BatchHeader, events: list[AnyEvent]) -> Batch:
    """A Batch of ``events`` under ``header``'s fields (an ``EncodedBatch`` whose events are still
    raw, or a JSON Lines envelope)."""
    return Batch(**header_fields(header), events=events)


def decode_batch(data: bytes | memoryview) -> Batch:
    """Decode one msgpack batch, ``Columns`` elements expanded into their events. Raises
    ``msgspec.DecodeError`` or ``ValidationError`` on bad input."""
    if _has_columns(data) is None:
        return _batch_decoder.decode(data)
    stored = _stored_batch_decoder.decode(data)
    return batch_with_events(stored, expand_columns(stored.events, _events_decoder))


def decode_events(data: bytes) -> list[AnyEvent]:
    """A msgpack array of events, ``Columns`` elements expanded (errors as ``decode_batch``)."""
    return decode_expanding(data, _events_decoder)


def decode_expanding(
    data: bytes | memoryview | msgspec.Raw, decoder: msgspec.msgpack.Decoder[Any]
) -> list[Any]:
    """A msgpack array of events decoded with ``decoder`` (of ``list[Union[...event Structs...]]``),
    ``Columns`` elements expanded into events of its Structs (``expand_columns``). Without a
    ``columns`` tag in ``data``, one scan for it and ``decoder`` alone. Raises
    ``msgspec.DecodeError`` or ``ValidationError`` on bad input."""
    if _has_columns(data) is None:
        return decoder.decode(data)
    return expand_columns(_decoding_columns(decoder).decode(data), decoder)


def has_columns(data: bytes | memoryview | msgspec.Raw) -> bool:
    """Whether encoded events may hold a ``Columns`` element (a scan for its tag, no decoding)."""
    return _has_columns(data) is not None


@functools.cache
def _decoding_columns(decoder: msgspec.msgpack.Decoder[Any]) -> msgspec.msgpack.Decoder[Any]:
    """``decoder`` (of ``list[Union[...]]``) that also decodes ``Columns`` elements."""
    union: Any = Union[(*_members(decoder), Columns)]
    return msgspec.msgpack.Decoder(list[union])


def expand_columns(items: list[Any], decoder: msgspec.msgpack.Decoder[Any]) -> list[Any]:
    """``items`` (decoded with ``_decoding_columns(decoder)``) with each ``Columns`` element
    replaced, where it stood, by the events it stands for, as ``decoder``'s Structs: built straight
    from the columns (``column_structs.build``), or, for Structs that cannot be, decoded from the
    maps ``cupti.columnar.expand`` packs (only the fields ``decoder``'s Structs read). Raises
    ``msgspec.ValidationError`` for a damaged element."""
    at = [i for i, item in enumerate(items) if type(item) is Columns]
    if not at:
        return items
    classes = _classes(decoder)
    out: list[Any] = []
    done = 0
    for i in at:
        columns = items[i]
        columns.check()
        out += items[done:i]
        cls = classes.get(columns.event)
        events = column_structs.build(columns, cls) if cls is not None else None
        out += events if events is not None else _expand_as_maps(columns, decoder)
        done = i + 1
    out += items[done:]
    return out


def _expand_as_maps(columns: Columns, decoder: msgspec.msgpack.Decoder[Any]) -> list[Any]:
    """The fallback of ``expand_columns``: the events packed as msgpack maps, then decoded."""
    from cuptistream.cupti.columnar import expand  # numpy: only where a reader needs maps

    fields, zero = _fields_read(decoder).get(columns.event, (None, frozenset()))
    return decoder.decode(expand(columns, fields, array_header(columns.rows), zero))


def _members(decoder: msgspec.msgpack.Decoder[Any]) -> tuple[Any, ...]:
    (union,) = typing.get_args(decoder.type)
    return typing.get_args(union) if typing.get_origin(union) is Union else (union,)


@functools.cache
def _classes(decoder: msgspec.msgpack.Decoder[Any]) -> dict[str, type[msgspec.Struct]]:
    """``decoder``'s event Structs by tag."""
    return {
        str(cls.__struct_config__.tag): cls
        for cls in _members(decoder)
        if isinstance(cls, type) and issubclass(cls, msgspec.Struct)
    }


@functools.cache
def _fields_read(decoder: msgspec.msgpack.Decoder[Any]) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """By event tag: the encoded field names ``decoder``'s Struct reads, and those of them whose
    default is zero (left out of an expansion where every row is zero: the Struct fills them in)."""
    found = {}
    for tag, cls in _classes(decoder).items():
        names, defaults = cls.__struct_encode_fields__, cls.__struct_defaults__
        zero = {
            n
            for n, d in zip(names[len(names) - len(defaults) :], defaults, strict=True)
            if d in (0, (0, 0, 0))
        }
        found[tag] = (frozenset(names), frozenset(zero))
    return found


def encode_batch_object(batch: Batch) -> bytes:
    return _encoder.encode(batch)


def to_json(obj: object) -> bytes:
    """Compact JSON of an event, batch or envelope (msgspec's encoding of the Structs)."""
    return _json_encoder.encode(obj)
