"""Decoding whole activity buffers into events, in bulk, off CUPTI's thread.

A buffer is a run of packed records, each starting with its ``CUpti_ActivityKind``. Decoding:

1. *Walk*: read each record's kind and step by that kind's record size, collecting offsets per kind
   (one cheap loop over 4-byte ints; no per-record objects).
2. *Gather*: view each kind's records as one numpy structured array (cupti-python's dtypes).
3. *Convert*: turn columns into event Structs (``cupti.convert``), or for the hot kinds straight
   into msgpack (``cupti.packed``), resolving each distinct name pointer once.

Steps 1 and 2 (and the record layouts they need) are ``cupti.records``; this module drives the
three steps over one buffer, hands out encoded chunks and keeps the session's counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cuptistream.cupti.columnar import Allocate
from cuptistream.cupti.convert import StructConverters
from cuptistream.cupti.kinds import BY_VALUE
from cuptistream.cupti.names import Names
from cuptistream.cupti.packed import PackedConverters
from cuptistream.cupti.records import (
    RecordLayouts,
    SizeLearner,
    gather,
    walk_runs,
)
from cuptistream.events import Event
from cuptistream.recording.codec import Chunk, encode_chunk

_EVENTS_PER_CHUNK = 8192

# Sees every gathered array before it is converted: (CUpti_ActivityKind, event type, records). The
# collector's statistics and window counts; it must not keep ``records`` past the call.
Observer = Callable[[int, str, np.ndarray], None]


class Decoder:
    """Turns activity buffers into events. One per session; not thread-safe (one decode thread).

    Marker START and END records are paired into ``NvtxRange`` events across buffers
    (``convert.StructConverters``). ``observer`` (optional) sees every gathered array; an exception
    it raises propagates out of the decode call. ``columns``: ``decode_packed`` gives the hot kinds
    as ``events.Columns`` elements (for sinks that take them, ``Sink.accepts_columns``).
    """

    def __init__(
        self,
        names: Names,
        layouts: RecordLayouts | None = None,
        demangle_names: bool = False,
        observer: Observer | None = None,
        columns: bool = False,
    ) -> None:
        self.names = names
        self.observer = observer
        self.layouts = layouts or RecordLayouts()
        self.demangle = demangle_names
        self.records_decoded = 0
        self.unknown_kinds: dict[int, int] = {}
        self.device_ids: set[int] = set()  # device ordinals the records named (attribution)
        self._structs = StructConverters(names, demangle_names)
        self._packed = PackedConverters(names, columns)

    @property
    def allocate(self) -> Allocate | None:
        """Where ``decode_packed`` writes the hot kinds' elements (None: the heap)."""
        return self._packed.allocate

    @allocate.setter
    def allocate(self, allocate: Allocate | None) -> None:
        self._packed.allocate = allocate

    def decode(self, data: memoryview | bytes, valid: int, learn: SizeLearner | None = None) -> list[Event]:
        """Every event in one buffer. Raises ``LayoutError`` if the buffer cannot be walked."""
        events: list[Event] = []
        for kind, event, records in self._records(data, valid, learn):
            events.extend(self._structs.convert(event, kind, records))
        return events

    def decode_packed(
        self, data: memoryview | bytes, valid: int, learn: SizeLearner | None = None, ends: Sequence[int] = ()
    ) -> list[Chunk]:
        """Every event in one buffer, already encoded: the hot kinds without a Struct per record
        (``columnar``), the others from their events. Same events as ``decode``, grouped.
        ``ends``: where joined buffers end inside ``data`` (``records.walk``)."""
        chunks: list[Chunk] = []
        for kind, event, records in self._records(data, valid, learn, ends):
            pack = None if self.demangle and event == "kernel" else self._packed.by_event.get(event)
            for lo in range(0, len(records), _EVENTS_PER_CHUNK):
                part = records[lo : lo + _EVENTS_PER_CHUNK]
                if pack is not None:
                    elements = 1 if self._packed.columns else len(part)
                    chunks.append(Chunk(pack(kind, part), len(part), elements=elements))
                elif events := self._structs.convert(event, kind, part):
                    chunks.append(encode_chunk(events))
        return chunks

    def observe(
        self, data: memoryview | bytes, valid: int, learn: SizeLearner | None = None, ends: Sequence[int] = ()
    ) -> int:
        """Walk and gather one buffer for the observer only, converting nothing (raw records that
        are not forwarded). The number of records. Raises ``LayoutError`` as ``decode`` does."""
        return sum(len(records) for _, _, records in self._records(data, valid, learn, ends))

    def _records(
        self, data: memoryview | bytes, valid: int, learn: SizeLearner | None, ends: Sequence[int] = ()
    ) -> list[tuple[int, str, np.ndarray]]:
        """(kind, event type, records as a structured array) per kind in the buffer."""
        view = memoryview(data).cast("B")
        out: list[tuple[int, str, np.ndarray]] = []
        for kind, runs in walk_runs(view, valid, self.layouts, learn, ends).items():
            spec = BY_VALUE.get(kind)
            chosen = self.layouts.dtype(kind)
            if spec is None or chosen is None:
                self.unknown_kinds[kind] = self.unknown_kinds.get(kind, 0) + len(runs)
                continue
            records = gather(view, runs, chosen[1])
            if "device_id" in (records.dtype.names or ()) and spec.event != "device":
                self.device_ids.update(_distinct(records["device_id"]))
            out.append((kind, spec.event, records))
            self.records_decoded += len(records)
            if self.observer is not None:
                self.observer(kind, spec.event, records)
        return out


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct values: most buffers name one device, found without ``np.unique``'s sort."""
    low, high = int(values.min()), int(values.max())
    return [low] if low == high else np.unique(values).tolist()
