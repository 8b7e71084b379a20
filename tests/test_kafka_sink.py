"""Kafka sink against a real broker (tansu): round trip, value formats, backpressure, bad settings."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import msgspec
import pytest
import trio
from kafka_broker import TansuBroker, free_port, kafka_broker_fixture  # noqa: F401 - the fixture
from kafka_data import batch_for, events_for, key_of

from cuptistream.config import convert
from cuptistream.errors import ConfigError, SinkUnavailableError, UserError
from cuptistream.recording.kafka_reader import iter_kafka_batches, iter_kafka_messages, parse_url
from cuptistream.sinks.kafka import KafkaSink, KafkaSinkConfig

encode = msgspec.msgpack.encode


def make_config(broker: TansuBroker | None, **overrides: object) -> KafkaSinkConfig:
    entry: dict[str, object] = {"type": "kafka", "name": "kafka", "topic": "gpu", "connect_timeout": "3s"}
    if broker is not None:
        entry["bootstrap_servers"] = broker.bootstrap
    entry.update(overrides)
    return convert(entry, KafkaSinkConfig, "sinks[0]")


async def produce(config: KafkaSinkConfig, batches: int, per_batch: int) -> dict[str, int]:
    sink = KafkaSink(config)
    await sink.open()
    await sink.connect()
    for seq in range(batches):
        await sink.write(batch_for(seq, events_for(seq, per_batch)))
    await sink.close()
    return sink.stats()


def test_million_events_round_trip_byte_equal_in_order_per_key(kafka_broker: TansuBroker) -> None:
    batches, per_batch = 125, 8000  # 1,000,000 events in pipeline-sized batches
    stats = trio.run(produce, make_config(kafka_broker), batches, per_batch)
    assert stats["acked_events"] == batches * per_batch
    assert stats["dropped_events"] == stats["retried_messages"] == stats["in_flight_bytes"] == 0

    read: dict[bytes, list[bytes]] = defaultdict(list)
    idents = []
    for message in iter_kafka_messages(f"kafka://{kafka_broker.bootstrap}/gpu", timeout_s=10):
        assert message.key is not None
        idents.append(message.ident)
        assert message.headers["content-type"] == b"application/vnd.cuptistream.batch+msgpack"
        assert message.headers["host"] == b"testhost" and message.headers["pid"] == b"4242"
        read[message.key].extend(encode(event) for event in message.batch.events)
    assert len(idents) == len(set(idents)), "a healthy run must not duplicate messages"

    expected: dict[bytes, list[bytes]] = defaultdict(list)
    for seq in range(batches):
        for event in events_for(seq, per_batch):
            expected[key_of(event)].append(encode(event))
    assert sorted(read) == sorted(expected) == [b"testhost:4242:-", b"testhost:4242:0", b"testhost:4242:1"]
    for key, events in expected.items():
        assert read[key] == events, f"events of {key!r} differ or are out of order"


def test_headers_families_and_topic_per_family(kafka_broker: TansuBroker) -> None:
    config = make_config(kafka_broker, topic="gpu.{event_family}", key="{host}:{pid}")
    stats = trio.run(produce, config, 3, 100)
    assert stats["acked_messages"] == 6  # 3 batches x (kernel, api)
    kernels = list(iter_kafka_messages(f"kafka://{kafka_broker.bootstrap}/gpu.kernel"))
    apis = list(iter_kafka_messages(f"kafka://{kafka_broker.bootstrap}/gpu.api"))
    assert [m.headers["event_families"] for m in kernels] == [b"kernel"] * 3
    assert [m.headers["event_families"] for m in apis] == [b"api"] * 3
    assert [m.headers["seq"] for m in kernels] == [b"0", b"1", b"2"]
    assert {m.key for m in kernels + apis} == {b"testhost:4242"}
    assert sum(len(m.batch.events) for m in kernels) == 3 * 98
    assert kernels[0].headers["schema_version"] == b"1"


def test_json_values_read_back_equal(kafka_broker: TansuBroker) -> None:
    stats = trio.run(produce, make_config(kafka_broker, value_format="json", key="{host}"), 2, 300)
    assert stats["acked_events"] == 600
    events = [e for b in iter_kafka_batches(f"kafka://{kafka_broker.bootstrap}/gpu") for e in b.events]
    assert events == events_for(0, 300) + events_for(1, 300)


def test_large_batch_is_cut_under_max_message_bytes(kafka_broker: TansuBroker) -> None:
    config = make_config(kafka_broker, key="{host}", max_message_bytes="64KiB")
    stats = trio.run(produce, config, 1, 5000)  # about 600 KB of events
    messages = list(iter_kafka_messages(f"kafka://{kafka_broker.bootstrap}/gpu"))
    assert stats["acked_messages"] == len(messages) > 5
    assert all(len(encode(m.batch)) <= 64 * 1024 for m in messages)
    assert [e for m in messages for e in m.batch.events] == events_for(0, 5000)
    assert messages[-1].headers["part"] == f"{len(messages) - 1}/{len(messages)}".encode()


def test_block_mode_applies_backpressure_while_broker_is_stopped(kafka_broker: TansuBroker) -> None:
    """SIGSTOP the broker: writes stop returning once max_in_flight_bytes are held; after SIGCONT
    everything is delivered and nothing is dropped."""
    config = make_config(kafka_broker, key="{host}", max_in_flight_bytes="1MiB", linger=0)
    written: list[int] = []

    async def main() -> tuple[int, dict[str, int]]:
        sink = KafkaSink(config)
        await sink.open()
        await sink.connect()
        kafka_broker.pause()
        blocked_at = -1
        try:
            for seq in range(40):
                with trio.move_on_after(2) as scope:
                    await sink.write(batch_for(seq, events_for(seq, 2000)))  # about 240 KB each
                if scope.cancelled_caught:
                    blocked_at = seq
                    break
                written.append(seq)
        finally:
            kafka_broker.resume()
        in_flight = sink.stats()["in_flight_bytes"]
        for seq in range(blocked_at, blocked_at + 3):
            await sink.write(batch_for(seq, events_for(seq, 2000)))
            written.append(seq)
        await sink.close()
        assert in_flight >= 1024 * 1024 - 300_000
        return blocked_at, sink.stats()

    blocked_at, stats = trio.run(main)
    assert 3 <= blocked_at < 10, "writes must block once about 1 MiB is held"
    assert stats["acked_events"] == len(written) * 2000 and stats["dropped_events"] == 0
    seqs = [m.headers["seq"] for m in iter_kafka_messages(f"kafka://{kafka_broker.bootstrap}/gpu")]
    assert sorted({int(s) for s in seqs}) == sorted(set(written))


# --- bad settings: one line each, at start-up ----------------------------------------------------


def _open_error(config: KafkaSinkConfig) -> UserError:
    async def main() -> None:
        sink = KafkaSink(config)
        await sink.open()  # local: templates, secrets
        await sink.connect()  # the network: what the pipeline retries in the background

    with pytest.raises(UserError) as caught:
        trio.run(main)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("sinks[")
    return caught.value


def test_unreachable_bootstrap_fails_fast() -> None:
    started = time.monotonic()
    error = _open_error(make_config(None, bootstrap_servers=f"127.0.0.1:{free_port()}", connect_timeout="1s"))
    assert isinstance(error, SinkUnavailableError)
    assert "no broker reachable at 127.0.0.1:" in str(error) and "check bootstrap_servers" in str(error)
    assert time.monotonic() - started < 5


def test_bad_topic_names(kafka_broker: TansuBroker) -> None:
    error = _open_error(make_config(kafka_broker, topic="gpu events!"))
    assert isinstance(error, ConfigError)
    assert "'gpu events!' is not a legal Kafka topic name" in str(error)
    error = _open_error(make_config(kafka_broker, topic="gpu.{family}"))
    assert "unknown placeholder {family}" in str(error) and "{event_family}" in str(error)


def test_wrong_sasl_credentials(kafka_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = TansuBroker(kafka_broker.binary, authentication=True)  # accepts no one: no users exist
    broker.start()
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "hunter2-secret")
    try:
        config = make_config(
            broker,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-256",
            sasl_username="alice",
            sasl_password_env="TEST_KAFKA_PASSWORD",
            connect_timeout="2s",
        )
        error = _open_error(config)
    finally:
        broker.kill()
    assert "SASL SCRAM-SHA-256 login as 'alice'" in str(error)
    assert "$TEST_KAFKA_PASSWORD" in str(error) and "hunter2" not in str(error)


def test_missing_secret_env_var(kafka_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KAFKA_PASSWORD", raising=False)
    config = make_config(
        kafka_broker,
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password_env="NO_SUCH_KAFKA_PASSWORD",
    )
    error = _open_error(config)
    assert isinstance(error, ConfigError)  # the same class and form as the OTLP sink's headers_env
    assert str(error) == (
        "sinks[kafka].sasl_password_env: environment variable NO_SUCH_KAFKA_PASSWORD is not set; "
        "export the secret there"
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"sasl_mechanism": "GSSAPI-ISH"},
            'sinks[0].sasl_mechanism: "GSSAPI-ISH" is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512',
        ),
        ({"security_protocol": "SASL_PLAINTEXT"}, "needs sasl_mechanism"),
        ({"acks": 1}, "enable_idempotence needs acks: all"),
        ({"on_unavailable": "spool"}, "spool needs spool_directory"),
        ({"max_in_flight_bytes": "lots"}, "sinks[0].max_in_flight_bytes"),
    ],
)
def test_bad_config_values(overrides: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(None, **overrides)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_spool_directory_is_exclusive(kafka_broker: TansuBroker, tmp_path: Path) -> None:
    config = make_config(kafka_broker, on_unavailable="spool", spool_directory=str(tmp_path))

    async def main() -> None:
        first = KafkaSink(config)
        await first.open()
        try:
            with pytest.raises(SinkUnavailableError, match="in use by another process"):
                await KafkaSink(config).open()
        finally:
            await first.close()

    trio.run(main)


def test_reader_url_and_errors(kafka_broker: TansuBroker) -> None:
    assert parse_url("kafka://a:1,b:2/topic.x") == (["a:1", "b:2"], "topic.x")
    with pytest.raises(UserError, match="expected kafka://host:port/topic"):
        parse_url("kafka://a:1")
    trio.run(produce, make_config(kafka_broker), 1, 10)
    with pytest.raises(UserError, match="does not exist"):
        list(iter_kafka_batches(f"kafka://{kafka_broker.bootstrap}/nope-not-here", timeout_s=2))


def test_spool_left_at_close_is_replayed_by_the_next_run(kafka_broker: TansuBroker, tmp_path: Path) -> None:
    """Broker stopped at close: unacked messages stay in the spool on disk; the next sink sends them."""
    spool = tmp_path / "spool"
    config = make_config(
        kafka_broker, key="{host}", on_unavailable="spool", spool_directory=str(spool), spool_after="200ms",
        max_in_flight_bytes="256KiB", retry={"max_elapsed": "1s"}, timeout="1s",
    )  # fmt: skip

    async def first_run() -> dict[str, int]:
        sink = KafkaSink(config)
        await sink.open()
        await sink.connect()
        kafka_broker.pause()
        for seq in range(10):
            await sink.write(batch_for(seq, events_for(seq, 1000)))
        with trio.move_on_after(1):
            await sink.close()
        return sink.stats()

    try:
        first = trio.run(first_run)
    finally:
        kafka_broker.resume()
    assert first["spooled_events"] > 0 and first["dropped_events"] == 0
    assert list(spool.glob("spool-*.kafka.zst")), "the spool must keep what was not acked"

    async def second_run() -> dict[str, int]:
        sink = KafkaSink(config)
        await sink.open()
        await sink.connect()
        await sink.close()
        return sink.stats()

    second = trio.run(second_run)
    assert second["replayed_events"] > 0 and second["spool_bytes"] == 0
    seqs = {m.ident[2] for m in iter_kafka_messages(f"kafka://{kafka_broker.bootstrap}/gpu")}
    assert seqs == set(range(10)), "every batch arrives once the spool is replayed"


def test_block_mode_counts_what_is_unacked_at_close(kafka_broker: TansuBroker) -> None:
    config = make_config(kafka_broker, key="{host}", retry={"max_elapsed": "1s"}, timeout="1s")

    async def main() -> tuple[dict[str, int], dict[str, int]]:
        sink = KafkaSink(config)
        await sink.open()
        await sink.connect()
        kafka_broker.pause()
        for seq in range(3):
            await sink.write(batch_for(seq, events_for(seq, 500)))
        await sink.close()  # gives up after retry.max_elapsed
        return sink.stats(), sink.delivery_losses()

    try:
        stats, lost = trio.run(main)
    finally:
        kafka_broker.resume()
    # Each message is given up once: past retry.max_elapsed while the sink ran, or at close.
    assert stats["dropped_events"] == sum(lost.values()) == 1500
    assert set(lost) <= {"retries_exhausted", "shutdown"}
    assert stats["undelivered_events"] == lost.get("shutdown", 0)
    assert stats["acked_events"] == 0
