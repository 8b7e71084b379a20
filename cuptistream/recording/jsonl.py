"""The JSON Lines layout, shared by the file sink (``format: jsonl``), the stdout sink and ``cat``.

Each batch is one envelope line followed by one line per event::

    {"type":"batch","schema_version":1,"session_id":"…","seq":0,"resource":{…},"attributes":{…},
     "clock":{…},"event_count":2}
    {"type":"kernel","start":…,"end":…,"name":"…",…}
    {"type":"memcpy",…}

Event lines are msgspec's JSON of the event Structs, tagged with ``type``, so they decode back into
the same events. ``event_count`` lets a reader tell a complete batch from one cut short.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from cuptistream.errors import JsonlError as JsonlError
from cuptistream.events import AnyEvent, Batch, BatchHeader, header_fields
from cuptistream.recording.codec import batch_with_events


class Envelope(BatchHeader, tag_field="type", tag="batch", kw_only=True):
    """The first line of every batch: the Batch's header (no events), plus how many events follow."""

    event_count: int


_encoder = msgspec.json.Encoder()
_envelope_decoder = msgspec.json.Decoder(Envelope)
_event_decoder = msgspec.json.Decoder(AnyEvent)


def encode_batch(batch: Batch) -> bytes:
    """The JSON Lines of one batch, each line ending in ``\\n``."""
    envelope = Envelope(**header_fields(batch), event_count=len(batch.events))
    return _encoder.encode(envelope) + b"\n" + _encoder.encode_lines(batch.events)


@dataclass(frozen=True)
class Incomplete:
    """A batch cut short at the end of the data: it starts at ``offset`` and runs to the end."""

    offset: int


def iter_batches(data: bytes) -> Iterator[Batch | Incomplete]:
    """Parse JSON Lines back into Batches; yield one ``Incomplete`` last if the data ends mid-batch.

    Raises ``JsonlError`` (with the line number) on a line that is not ours.
    """
    offset = 0
    line_number = 1
    end = len(data)
    while offset < end:
        start = offset
        newline = data.find(b"\n", offset)
        if newline < 0:
            yield Incomplete(start)  # the envelope line itself was cut short
            return
        try:
            envelope = _envelope_decoder.decode(data[offset:newline])
        except msgspec.DecodeError as error:
            raise JsonlError(f"line {line_number} is not a cuptistream batch envelope ({error})") from None
        offset = newline + 1
        # Find the end of the batch's event lines: event_count newlines further on.
        events_start = offset
        for _ in range(envelope.event_count):
            newline = data.find(b"\n", offset)
            if newline < 0:
                yield Incomplete(start)
                return
            offset = newline + 1
        try:
            events = _event_decoder.decode_lines(data[events_start:offset])
        except msgspec.DecodeError as error:
            raise JsonlError(
                f"events after line {line_number} are not cuptistream events ({error})"
            ) from None
        if len(events) != envelope.event_count:
            raise JsonlError(f"batch at line {line_number} has blank lines among its events")
        yield batch_with_events(envelope, events)
        line_number += 1 + envelope.event_count
