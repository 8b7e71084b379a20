"""Turns one pipeline batch into Kafka messages: topic and key per the templates, headers, value.

Events are never re-encoded. The batch is decoded twice, cheaply: once into ``msgspec.Raw`` slices
(the exact bytes of each event) and once into tiny structs that read only the ``type`` tag and
``device_id``. Events are grouped by (topic, key) and each group's slices are joined under a new array
header, so every event reaches Kafka byte-for-byte as the pipeline encoded it. A group larger than
``max_message_bytes`` is cut into several messages (headers ``part`` = ``i/n``).
"""

from __future__ import annotations

import string
from typing import Any, Optional, Union

import msgspec

from cuptistream.errors import ConfigError
from cuptistream.events import EVENT_TYPES, SCHEMA_VERSION, Batch, EncodedBatch
from cuptistream.plugin import sink_where
from cuptistream.recording.codec import array_header, batch_with_events, decode_events, to_json
from cuptistream.recording.rows import cut_rows

BATCH_FIELDS = frozenset({"host", "pid", "session_id", "process_name"})
EVENT_FIELDS = frozenset({"event_family", "device"})
NO_DEVICE = "-"  # {device} for events that belong to no device (API calls, NVTX, accounting)
CONTENT_TYPES = {
    "msgpack": "application/vnd.cuptistream.batch+msgpack",
    "json": "application/vnd.cuptistream.batch+json",
    "jsonl": "application/x-ndjson",  # one flat row per event: cuptistream/recording/rows.py
}
_LEGAL_TOPIC = frozenset(string.ascii_letters + string.digits + "._-")


class Message(msgspec.Struct, array_like=True):
    """One Kafka record, as sent and as kept in the spool."""

    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    events: int
    seq: int  # the pipeline batch it came from

    @property
    def nbytes(self) -> int:
        return len(self.value) + len(self.key) + sum(len(k) + len(v) for k, v in self.headers)


def _route_struct(tag: str) -> type:
    # Unknown fields are skipped while decoding, so this reads just the tag and device_id.
    return msgspec.defstruct(
        f"_Route_{tag}",
        [("device_id", Optional[int], None)],  # noqa: UP045 - a runtime type object for defstruct
        tag_field="type",
        tag=tag,
    )


_RouteUnion: Any = Union[tuple(_route_struct(tag) for tag in EVENT_TYPES)]  # noqa: UP007
_route_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(list[_RouteUnion])
_raw_decoder = msgspec.msgpack.Decoder(list[msgspec.Raw])
_envelope_decoder = msgspec.msgpack.Decoder(EncodedBatch)
_encoder = msgspec.msgpack.Encoder()


def topic_problem(topic: str) -> str | None:
    """Why Kafka would reject ``topic`` as a name, or None if it is legal."""
    if not topic:
        return "it is empty"
    if topic in (".", ".."):
        return "'.' and '..' are not allowed"
    if len(topic) > 249:
        return f"it is {len(topic)} characters long (at most 249)"
    bad = sorted(set(topic) - _LEGAL_TOPIC)
    if bad:
        return f"it contains {''.join(bad)!r}; use ASCII letters, digits, '.', '_' and '-'"
    return None


class _Template:
    def __init__(self, text: str, what: str, sink: str) -> None:
        fields = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
        unknown = fields - BATCH_FIELDS - EVENT_FIELDS
        if unknown or "" in fields:
            names = ", ".join("{" + f + "}" for f in sorted(BATCH_FIELDS | EVENT_FIELDS))
            raise ConfigError(
                f"{sink_where(sink, what)}: unknown placeholder {{{sorted(unknown)[0] if unknown else ''}}} "
                f"in {text!r} (known: {names})"
            )
        self.text = text
        self.per_event = bool(fields & EVENT_FIELDS)

    def render(self, values: dict[str, object]) -> str:
        return self.text.format(**values)


class Router:
    """Splits pipeline batches into messages. Stateless apart from its settings; thread-safe."""

    def __init__(
        self,
        sink: str,
        topic: str,
        key: str,
        value_format: str,
        max_message_bytes: int,
        extra_headers: dict[str, str],
    ) -> None:
        self.topic = _Template(topic, "topic", sink)
        self.key = _Template(key, "key", sink)
        self.value_format = value_format
        self.max_message_bytes = max_message_bytes
        self._static_headers = [("content-type", CONTENT_TYPES[value_format].encode())] + [
            (k, v.encode()) for k, v in extra_headers.items()
        ]
        # Every topic name the template can produce must be legal; check a representative set now.
        sample = {"host": "host", "pid": 1, "session_id": "s", "process_name": "p", "device": 0}
        for family in EVENT_TYPES:
            name = self.topic.render({**sample, "event_family": family})
            if problem := topic_problem(name):
                where = sink_where(sink, "topic")
                raise ConfigError(f"{where}: {name!r} is not a legal Kafka topic name: {problem}")

    def fixed_topics(self) -> list[str]:
        """The topics this router will use whatever the data, or [] if they depend on it."""
        fields = {name for _, name, _, _ in string.Formatter().parse(self.topic.text) if name}
        return [self.topic.text] if not fields else []

    def route(self, data: bytes) -> list[Message]:
        """The messages for one msgpack-encoded pipeline batch, in event order within each key."""
        envelope = _envelope_decoder.decode(data)
        resource = envelope.resource
        values: dict[str, object] = {
            "host": resource.host,
            "pid": resource.pid,
            "session_id": envelope.session_id,
            "process_name": resource.process_name,
        }
        routes = _route_decoder.decode(envelope.events)
        if not (self.topic.per_event or self.key.per_event):
            # One destination: the events need no regrouping, and often no re-encoding either.
            families = {type(route).__struct_config__.tag for route in routes}
            destination = (self.topic.render(values), self.key.render(values))
            if len(data) <= self.max_message_bytes and self.value_format == "msgpack":
                return [self._message(envelope, *destination, families, data, len(routes), "0/1")]
            raws = _raw_decoder.decode(envelope.events)
            return self._messages(envelope, *destination, raws, families)
        raws = _raw_decoder.decode(envelope.events)
        # Events of one (family, device) always share a destination: resolve each pair once, and
        # append in event order so the order within each key is kept.
        groups: dict[tuple[str, str], tuple[list[msgspec.Raw], set[str]]] = {}
        by_pair: dict[tuple[type, int | None], list[msgspec.Raw]] = {}
        for raw, route in zip(raws, routes, strict=True):
            pair = (type(route), route.device_id)
            events = by_pair.get(pair)
            if events is None:
                events = by_pair[pair] = self._group(groups, values, pair)
            events.append(raw)
        messages: list[Message] = []
        for (topic, key), (events, families) in groups.items():
            messages.extend(self._messages(envelope, topic, key, events, families))
        return messages

    def _group(
        self,
        groups: dict[tuple[str, str], tuple[list[msgspec.Raw], set[str]]],
        values: dict[str, object],
        pair: tuple[type, int | None],
    ) -> list[msgspec.Raw]:
        family: str = pair[0].__struct_config__.tag  # type: ignore[attr-defined]
        device = NO_DEVICE if pair[1] is None else pair[1]
        event_values = {**values, "event_family": family, "device": device}
        destination = (self.topic.render(event_values), self.key.render(event_values))
        group = groups.get(destination)
        if group is None:
            group = groups[destination] = ([], set())
        group[1].add(family)
        return group[0]

    def _messages(
        self, envelope: EncodedBatch, topic: str, key: str, events: list[msgspec.Raw], families: set[str]
    ) -> list[Message]:
        if self.value_format == "jsonl":
            return self._row_messages(envelope, topic, key, events, families)
        parts = self._cut(events)
        messages = []
        for index, part in enumerate(parts):
            envelope.events = msgspec.Raw(array_header(len(part)) + b"".join(part))
            value = _encoder.encode(envelope)
            if self.value_format == "json":
                value = _json_value(value)
            part_header = f"{index}/{len(parts)}"
            messages.append(self._message(envelope, topic, key, families, value, len(part), part_header))
        return messages

    def _row_messages(
        self, envelope: EncodedBatch, topic: str, key: str, events: list[msgspec.Raw], families: set[str]
    ) -> list[Message]:
        """jsonl: rows are cut by their own size (about twice the msgpack one), between lines."""
        batch = batch_with_events(envelope, decode_events(array_header(len(events)) + b"".join(events)))
        chunks = cut_rows(batch, self.max_message_bytes)
        return [
            self._message(envelope, topic, key, families, rows, count, f"{i}/{len(chunks)}")
            for i, (rows, count) in enumerate(chunks)
        ]

    def _message(
        self,
        envelope: EncodedBatch,
        topic: str,
        key: str,
        families: set[str],
        value: bytes,
        count: int,
        part: str,
    ) -> Message:
        resource = envelope.resource
        headers = [
            ("schema_version", str(SCHEMA_VERSION).encode()),
            *self._static_headers,
            ("event_families", ",".join(sorted(families)).encode()),
            ("host", resource.host.encode()),
            ("pid", str(resource.pid).encode()),
            ("session_id", envelope.session_id.encode()),
            ("seq", str(envelope.seq).encode()),
            ("part", part.encode()),
        ]
        return Message(topic, key.encode(), value, headers, count, envelope.seq)

    def _cut(self, events: list[msgspec.Raw]) -> list[list[msgspec.Raw]]:
        """Split events into runs whose encoded size stays under ``max_message_bytes``."""
        limit = self.max_message_bytes - 4096  # the envelope around the events
        parts: list[list[msgspec.Raw]] = [[]]
        size = 0
        if sum(len(raw) for raw in events) <= limit:
            return [events]
        for raw in events:
            length = len(raw)
            if parts[-1] and size + length > limit:
                parts.append([])
                size = 0
            parts[-1].append(raw)
            size += length
        return parts


def _json_value(msgpack_value: bytes) -> bytes:
    envelope = _envelope_decoder.decode(msgpack_value)
    return to_json(batch_with_events(envelope, decode_events(bytes(memoryview(envelope.events)))))


def split_message(message: Message) -> list[Message]:
    """Cut a message the broker refused as too large into two halves (same topic, key and order)."""
    half_headers = [[(k, v) for k, v in message.headers if k != "part"] for _ in range(2)]
    part = dict(message.headers).get("part", b"0/1").decode()
    if dict(message.headers).get("content-type") == CONTENT_TYPES["jsonl"].encode():
        rows = message.value.splitlines(keepends=True)
        middle = len(rows) // 2
        values, counts = [b"".join(rows[:middle]), b"".join(rows[middle:])], [middle, len(rows) - middle]
    elif message.value[:1] in (b"{", b"["):
        batch = msgspec.json.decode(message.value, type=Batch)
        middle = len(batch.events) // 2
        halves = [batch.events[:middle], batch.events[middle:]]
        values = []
        for events in halves:
            batch.events = events
            values.append(to_json(batch))
        counts = [len(h) for h in halves]
    else:
        envelope = _envelope_decoder.decode(message.value)
        raws = _raw_decoder.decode(envelope.events)
        middle = len(raws) // 2
        values, counts = [], []
        for run in (raws[:middle], raws[middle:]):
            envelope.events = msgspec.Raw(array_header(len(run)) + b"".join(run))
            values.append(_encoder.encode(envelope))
            counts.append(len(run))
    pieces = zip(values, counts, half_headers, strict=True)
    return [
        Message(message.topic, message.key, value, [*hs, ("part", f"{part}+{i}".encode())], n, message.seq)
        for i, (value, n, hs) in enumerate(pieces)
    ]
