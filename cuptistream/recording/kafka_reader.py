"""Read batches back from Kafka: ``kafka://host:port[,host:port...]/topic``.

Uses partition assignment, not a consumer group: every partition of the topic is assigned, read
from the beginning, and reading stops once each partition's position has reached the end offset
taken at the start (so a live topic does not keep the reader forever). Within a partition, and
therefore within a key, messages come in the order they were written; partitions are interleaved.

The Kafka sink delivers at least once, so a message may appear twice after an outage; the headers
key and the headers ``session_id``, ``seq`` and ``part`` identify it (``KafkaMessage.ident``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec

from cuptistream.errors import UserError
from cuptistream.events import Batch
from cuptistream.recording.codec import decode_batch
from cuptistream.recording.rows import decode_rows

_json_batch = msgspec.json.Decoder(Batch)


@dataclass(frozen=True)
class KafkaMessage:
    partition: int
    offset: int
    key: bytes | None
    headers: dict[str, bytes]
    batch: Batch

    @property
    def ident(self) -> tuple[bytes, str, int, str]:
        """(key, session_id, seq, part): equal for a message and its at-least-once duplicates."""
        return (
            self.key or b"",
            self.headers.get("session_id", b"").decode(),
            int(self.headers.get("seq", b"-1")),
            self.headers.get("part", b"0/1").decode(),
        )


def parse_url(url: str) -> tuple[list[str], str]:
    """``kafka://a:9092,b:9092/topic`` -> (["a:9092", "b:9092"], "topic"). Raises UserError."""
    parts = urlsplit(url)
    topic = parts.path.lstrip("/")
    if parts.scheme != "kafka" or not parts.netloc or not topic or "/" in topic:
        raise UserError(f"{url}: expected kafka://host:port/topic")
    return [s for s in parts.netloc.split(",") if s], topic


def open_topic(url: str, timeout_s: float) -> tuple[Any, list[Any]]:
    """A consumer with every partition of the topic assigned, at its beginning; and the partitions.
    Raises ``UserError`` when no broker answers within ``timeout_s`` or the topic does not exist.
    The caller closes the consumer."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    servers, topic = parse_url(url)
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=servers,
            group_id=None,
            enable_auto_commit=False,
            bootstrap_timeout_ms=int(timeout_s * 1000),
            request_timeout_ms=max(int(timeout_s * 1000), 5000) + 1000,
            max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )
    except KafkaError as error:
        raise UserError(
            f"{url}: no broker reachable within {timeout_s:g}s ({type(error).__name__})"
        ) from None
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise UserError(f"{url}: topic {topic!r} does not exist; start the job (or its sink) first")
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        consumer.seek_to_beginning()
    except BaseException:
        consumer.close()
        raise
    return consumer, assigned


def message_batch(message: Any) -> tuple[dict[str, bytes], Batch]:
    """A consumed record's headers and its batch, decoded by the rules above."""
    headers = {k: bytes(v) for k, v in (message.headers or [])}
    return headers, _decode(headers, message.value)


def iter_kafka_messages(url: str, timeout_s: float = 5.0) -> Iterator[KafkaMessage]:
    """Every message of the topic, decoded. Raises ``UserError`` when the broker cannot be reached
    within ``timeout_s``, the topic does not exist, or no progress is made for ``timeout_s``."""
    consumer, assigned = open_topic(url, timeout_s)
    try:
        end = consumer.end_offsets(assigned)
        # A fetch returns whole record batches, so the position jumps past the last one in a go.
        waiting = {tp for tp in assigned if consumer.position(tp) < end[tp]}
        last_progress = time.monotonic()
        while waiting:
            records = consumer.poll(timeout_ms=200)
            if records:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > timeout_s:
                behind = ", ".join(f"{tp.partition}@{consumer.position(tp)}<{end[tp]}" for tp in waiting)
                raise UserError(f"{url}: no progress for {timeout_s:g}s (partitions behind: {behind})")
            for tp, messages in records.items():
                for message in messages:
                    headers, batch = message_batch(message)
                    yield KafkaMessage(tp.partition, message.offset, message.key, headers, batch)
            waiting = {tp for tp in waiting if consumer.position(tp) < end[tp]}
    finally:
        consumer.close()


def iter_kafka_batches(url: str, timeout_s: float = 5.0) -> Iterator[Batch]:
    """The batches of every message in the topic (see ``iter_kafka_messages``)."""
    for message in iter_kafka_messages(url, timeout_s):
        yield message.batch


def _decode(headers: dict[str, bytes], value: bytes) -> Batch:
    content_type = headers.get("content-type", b"")
    if content_type.endswith(b"+json"):
        return _json_batch.decode(value)
    if content_type == b"application/x-ndjson":  # value_format: jsonl, times already epoch ns
        return decode_rows(value)
    return decode_batch(value)
