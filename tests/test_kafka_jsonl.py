"""Kafka ``value_format: jsonl`` as a warehouse consumer sees it: messages read from a real broker
(tansu) with kafka-python, every line loaded with nothing but ``json`` and validated with
``jsonschema`` against the published docs/events.schema.json; and that schema is current."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import jsonschema
import trio
from kafka_broker import TansuBroker, kafka_broker_fixture  # noqa: F401 - the fixture
from kafka_consume import consume
from kafka_data import RESOURCE, batch_for, events_for, key_of

from cuptistream.config import convert
from cuptistream.sinks.kafka import KafkaSink, KafkaSinkConfig

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "docs" / "events.schema.json"
UNIX_NS = 1_700_000_000_000_000_000  # kafka_data's ClockSync(cupti_ns=1_000, unix_ns=UNIX_NS)
OFFSET = UNIX_NS - 1_000


def test_the_published_schema_is_current() -> None:
    from tests.helpers.scripts import script

    assert SCHEMA.read_text() == script("events_schema").render(), (
        "docs/events.schema.json is stale: run scripts/events_schema.py"
    )


def produce(bootstrap: str, batches: int, per_batch: int, **keys: Any) -> dict[str, int]:
    entry = {"type": "kafka", "name": "kafka", "topic": "rows", "bootstrap_servers": bootstrap,
             "connect_timeout": "3s", "value_format": "jsonl", **keys}  # fmt: skip
    sink = KafkaSink(convert(entry, KafkaSinkConfig, "sinks[0]"))

    async def main() -> None:
        await sink.open()
        await sink.connect()
        for seq in range(batches):
            await sink.write(batch_for(seq, events_for(seq, per_batch)))
        await sink.close()

    trio.run(main)
    return sink.stats()


def test_a_consumer_needs_only_json_and_the_schema(kafka_broker: TansuBroker) -> None:
    batches, per_batch = 4, 500
    stats = produce(kafka_broker.bootstrap, batches, per_batch)
    assert stats["acked_events"] == batches * per_batch
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    rows_by_key: dict[bytes, list[dict[str, Any]]] = defaultdict(list)
    for record in consume(kafka_broker.bootstrap, "rows"):
        assert dict(record.headers)["content-type"] == b"application/x-ndjson"
        for line in record.value.decode().splitlines():
            row = json.loads(line)
            errors = sorted(validator.iter_errors(row), key=str)
            assert not errors, f"{row['type']} row invalid: {errors[0].message}"
            rows_by_key[record.key].append(row)

    expected: dict[bytes, list[Any]] = defaultdict(list)
    for seq in range(batches):
        for event in events_for(seq, per_batch):
            expected[key_of(event)].append((seq, event))
    assert sorted(rows_by_key) == sorted(expected)
    for key, pairs in expected.items():
        rows = rows_by_key[key]
        assert len(rows) == len(pairs)
        for row, (seq, event) in zip(rows, pairs, strict=True):  # in order within a key
            assert (
                row["type"] == event.__struct_config__.tag and row["correlation_id"] == event.correlation_id
            )
            assert (row["start"], row["end"]) == (event.start + OFFSET, event.end + OFFSET)  # epoch ns
            assert (row["session_id"], row["seq"], row["host"], row["pid"]) == (
                "session-1",
                seq,
                RESOURCE.host,
                RESOURCE.pid,
            )
            assert row["attributes"] == {"job": "test"} and row["schema_version"] == 1
            assert row.get("device_id") == getattr(event, "device_id", None)


def test_rows_survive_a_cut_under_max_message_bytes(kafka_broker: TansuBroker) -> None:
    stats = produce(kafka_broker.bootstrap, 1, 3000, key="{host}", max_message_bytes="32KiB")
    records = consume(kafka_broker.bootstrap, "rows")
    assert stats["acked_events"] == 3000 and len(records) > 1
    assert all(len(r.value) <= 32 * 1024 for r in records)
    rows = [json.loads(line) for r in records for line in r.value.splitlines()]
    assert [r["correlation_id"] for r in rows] == [e.correlation_id for e in events_for(0, 3000)]


def test_the_reader_reads_rows_back_as_events(kafka_broker: TansuBroker) -> None:
    from cuptistream.recording.kafka_reader import iter_kafka_batches

    produce(kafka_broker.bootstrap, 1, 200, key="{host}")
    events = [e for b in iter_kafka_batches(f"kafka://{kafka_broker.bootstrap}/rows") for e in b.events]
    want = events_for(0, 200)
    assert [(e.start, e.end) for e in events] == [(e.start + OFFSET, e.end + OFFSET) for e in want]  # type: ignore[attr-defined]
    assert [type(e) for e in events] == [type(e) for e in want]


def test_rows_name_each_event_gpu_and_keep_epoch_fields() -> None:
    from cuptistream.events import Batch, ClockSync, CudaEvent, DeviceInfo, Kernel, Loss, Resource, SelfStats
    from cuptistream.recording.rows import cut_rows, encode_rows

    def batch() -> Batch:
        events = [
            Kernel(start=10, end=20, name="k", device_id=0, context_id=1, stream_id=2, correlation_id=3),
            Kernel(start=30, end=40, name="k", device_id=1, context_id=1, stream_id=2, correlation_id=4),
            CudaEvent(event_id=1, context_id=1, stream_id=2, correlation_id=5),  # device_timestamp 0: unset
            Loss(stage="intake", reason="queue_full", count=2, since=7, until=8),  # already epoch ns
            SelfStats(timestamp=9, stages={}),
        ]
        resource = Resource(
            host="h", pid=5, ppid=1, process_name="python3", command_line=[], rank=1, local_rank=1, world_size=2,
            devices=[DeviceInfo(device_id=0, name="H100", uuid="GPU-a"), DeviceInfo(device_id=1, name="H100", uuid="GPU-b")],
        )  # fmt: skip
        return Batch(schema_version=1, session_id="s", seq=7, resource=resource, attributes={},
                     clock=ClockSync(cupti_ns=100, unix_ns=1_000_100), events=events)  # fmt: skip

    rows = [json.loads(line) for line in encode_rows(batch()).splitlines()]
    assert [r.get("device_uuid") for r in rows] == ["GPU-a", "GPU-b", None, None, None]
    assert (rows[0]["start"], rows[1]["end"]) == (1_000_010, 1_000_040)
    assert "device_timestamp" not in rows[2] and (rows[3]["since"], rows[4]["timestamp"]) == (7, 9)
    assert all((r["rank"], r["world_size"], r["ppid"], r["seq"]) == (1, 2, 1, 7) for r in rows)
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    assert all(validator.is_valid(r) for r in rows)
    assert not validator.is_valid({**rows[0], "surprise": 1})  # the schema names every field
    chunks = cut_rows(batch(), 400)
    assert (
        sum(n for _, n in chunks) == 5 and len(chunks) > 1 and all(len(c) <= 400 for c, n in chunks if n > 1)
    )
