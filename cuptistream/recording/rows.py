"""Events as flat rows: one JSON object per event, with Unix-epoch times and the envelope folded in.

This is the layout of Kafka's ``value_format: jsonl`` (one row per line), the one a warehouse loads as
it is (ClickHouse ``JSONEachRow``, Spark ``read.json``, Flink's JSON format)::

    {"type":"kernel","start":1700000000000001000,"end":…,"name":"…",…,
     "session_id":"…","seq":3,"schema_version":1,"host":"…","pid":4242,"ppid":1,"process_name":"python",
     "rank":0,"local_rank":0,"world_size":8,"device_uuid":"GPU-…","attributes":{"team":"llm"}}

* The event's own fields come first, as in every other format (``docs/events.md``).
* Every time is Unix-epoch ns: the fields on CUPTI's clock (``CUPTI_CLOCK_FIELDS``) have the batch's
  clock offset added here, the one place this layout resolves it; fields already in epoch ns
  (``Loss.since``/``until``, ``SelfStats.timestamp``) are left as they are. ``Activity.fields`` are
  CUPTI's raw values and are not converted.
* Envelope fields follow (``ROW_ENVELOPE``); ``device_uuid`` is the GPU's UUID for an event with a
  ``device_id`` the envelope knows, and absent otherwise. ``rank``, ``local_rank`` and
  ``world_size`` are absent outside a distributed job.

``row_schema()`` is the JSON Schema of a row, generated from the event Structs; ``docs/events.schema.json``
is its published copy (``scripts/events_schema.py`` writes it, a test keeps it current).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import msgspec

from cuptistream.events import EVENT_TYPES, AnyEvent, Batch, ClockSync, Event, Loss, Resource, SelfStats

# Fields holding a time on CUPTI's clock, per event type (Loss and SelfStats carry epoch ns already).
_CLOCK_NAMES = ("start", "end", "timestamp", "device_timestamp", "interval_start", "interval_end")
CUPTI_CLOCK_FIELDS: dict[type[Event], tuple[str, ...]] = {
    cls: () if cls in (Loss, SelfStats) else tuple(f for f in cls.__struct_fields__ if f in _CLOCK_NAMES)
    for cls in EVENT_TYPES.values()
}


class RowEnvelope(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The envelope fields every row carries after the event's own."""

    session_id: str
    seq: int  # the pipeline batch the event came in; a gap per (session_id, host, pid) means loss
    schema_version: int
    host: str
    pid: int
    ppid: int = 0
    process_name: str = ""
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    device_uuid: str | None = None  # the GPU of an event with a device_id
    attributes: dict[str, str] = {}  # the config's session.attributes


ROW_ENVELOPE = tuple(RowEnvelope.__struct_fields__)


# One small function per shape of clock fields: about 3x faster than a getattr/setattr loop.
def _shift_span(ev: Any, offset: int) -> None:
    ev.start += offset
    ev.end += offset


def _shift_stamp(ev: Any, offset: int) -> None:
    ev.timestamp += offset


def _shift_device_stamp(ev: Any, offset: int) -> None:
    if ev.device_timestamp:  # 0 means "not reported"
        ev.device_timestamp += offset


def _shift_interval(ev: Any, offset: int) -> None:
    ev.interval_start += offset
    ev.interval_end += offset


def _keep(ev: Any, offset: int) -> None:
    pass


_SHAPES: dict[tuple[str, ...], Callable[[Any, int], None]] = {
    ("start", "end"): _shift_span,
    ("timestamp",): _shift_stamp,
    ("device_timestamp",): _shift_device_stamp,
    ("interval_start", "interval_end"): _shift_interval,  # the collector's statistics
    (): _keep,
}
_SHIFT = {cls: _SHAPES[fields] for cls, fields in CUPTI_CLOCK_FIELDS.items()}  # KeyError: a new shape
_encoder = msgspec.json.Encoder()


def _suffix(envelope: RowEnvelope) -> bytes:
    # ',"session_id":…}\n' to put in place of the closing brace of an event's own fields.
    return b"," + _encoder.encode(envelope)[1:] + b"\n"


def encode_rows(batch: Batch) -> bytes:
    """One line per event of ``batch``, each ending in ``\\n``. Mutates the batch's events (their
    times become epoch ns): pass a batch decoded for this purpose."""
    return b"".join(chunk for chunk, _ in cut_rows(batch, 0))


def cut_rows(batch: Batch, max_bytes: int) -> list[tuple[bytes, int]]:
    """``encode_rows`` cut between lines into chunks of at most ``max_bytes`` (0: one chunk; a
    single longer row is a chunk of its own), as (rows, row count). Mutates the events' times."""
    res = batch.resource
    base = RowEnvelope(
        session_id=batch.session_id,
        seq=batch.seq,
        schema_version=batch.schema_version,
        host=res.host,
        pid=res.pid,
        ppid=res.ppid,
        process_name=res.process_name,
        rank=res.rank,
        local_rank=res.local_rank,
        world_size=res.world_size,
        attributes=batch.attributes,
    )
    plain = _suffix(base)
    by_device: dict[int, bytes] = {}
    for device in res.devices:
        if device.uuid:
            by_device[device.device_id] = _suffix(msgspec.structs.replace(base, device_uuid=device.uuid))
    offset = batch.clock.offset_ns
    shift = _SHIFT
    events = batch.events
    for ev in events:
        shift[type(ev)](ev, offset)
    # A JSON line ends in "}\n" and nowhere else has a newline: the envelope goes in one replace.
    lines = _encoder.encode_lines(events)
    ordinals = [getattr(ev, "device_id", None) for ev in events] if by_device else []
    suffixes = {by_device.get(o, plain) if o is not None else plain for o in ordinals} or {plain}
    if len(suffixes) == 1:
        data = lines.replace(b"}\n", suffixes.pop())
        if not max_bytes or len(data) <= max_bytes:
            return [(data, len(events))] if events else []
        rows = data.splitlines(keepends=True)
    else:  # events of several GPUs in one message (a key without {device})
        rows = [
            row[:-2] + (by_device.get(o, plain) if o is not None else plain)
            for row, o in zip(lines.splitlines(keepends=True), ordinals, strict=True)
        ]
    chunks: list[tuple[bytes, int]] = []
    part: list[bytes] = []
    size = 0
    for row in rows:
        if max_bytes and part and size + len(row) > max_bytes:
            chunks.append((b"".join(part), len(part)))
            part, size = [], 0
        part.append(row)
        size += len(row)
    if part:
        chunks.append((b"".join(part), len(part)))
    return chunks


_row_decoder = msgspec.json.Decoder(AnyEvent)
_envelope_decoder = msgspec.json.Decoder(RowEnvelope)


def decode_rows(data: bytes) -> Batch:
    """The events of rows written by ``encode_rows`` (times stay epoch ns: the batch's clock offset
    is 0), with the first row's envelope. Raises ``msgspec.DecodeError`` on other input."""
    lines = [line for line in data.split(b"\n") if line.strip()]
    events = [_row_decoder.decode(line) for line in lines]  # unknown fields (the envelope) are skipped
    if not lines:
        raise msgspec.DecodeError("no rows")
    env = _envelope_decoder.decode(lines[0])
    resource = Resource(
        host=env.host, pid=env.pid, ppid=env.ppid, process_name=env.process_name, command_line=[],
        rank=env.rank, local_rank=env.local_rank, world_size=env.world_size,
    )  # fmt: skip
    return Batch(
        schema_version=env.schema_version,
        session_id=env.session_id,
        seq=env.seq,
        resource=resource,
        attributes=env.attributes,
        clock=ClockSync(cupti_ns=0, unix_ns=0),
        events=events,
    )


def row_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of one row: any event type, plus the envelope fields."""
    schema: dict[str, Any] = msgspec.json.schema(AnyEvent)
    envelope = msgspec.json.schema(RowEnvelope)
    env_def = envelope["$defs"]["RowEnvelope"]
    defs = schema["$defs"]
    for cls in EVENT_TYPES.values():
        definition = defs[cls.__name__]
        for name in CUPTI_CLOCK_FIELDS[cls]:
            definition["properties"][name]["description"] = "Unix-epoch ns (CUPTI clock + the batch's offset)"
        definition["properties"].update(env_def["properties"])
        definition["required"] = sorted(
            set(definition.get("required", [])) | set(env_def.get("required", []))
        )
        definition["additionalProperties"] = False  # a row holds nothing the schema does not name
    for name, sub in envelope["$defs"].items():
        if name != "RowEnvelope":
            defs.setdefault(name, sub)
    for definition in defs.values():
        if "description" in definition:
            # Python 3.13 dedents docstrings when compiling, earlier versions do not: one text for both.
            definition["description"] = inspect.cleandoc(definition["description"])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "cuptistream event row",
        "description": "One event of Kafka value_format: jsonl (cuptistream/recording/rows.py): the event's "
        "fields, times in Unix-epoch ns, then the envelope.",
        **schema,
    }
