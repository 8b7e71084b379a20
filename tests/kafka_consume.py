"""Read a whole topic back, as a warehouse loader would (kafka-python only: the GPU machine has no
jsonschema, so this lives apart from the schema tests)."""

from __future__ import annotations

import time
from typing import Any


def consume(bootstrap: str, topic: str, timeout_s: float = 10.0, **settings: Any) -> list[Any]:
    """Every record of ``topic`` from the beginning; ``settings`` go to the consumer (TLS, SASL)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=[bootstrap], group_id=None, enable_auto_commit=False, **settings
    )
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        end = consumer.end_offsets(partitions)
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in partitions):
            assert time.monotonic() < deadline, "the broker stopped delivering"
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()
