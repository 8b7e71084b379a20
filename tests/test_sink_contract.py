"""The component model every sink shares: the same ``queue``/``batch``/``retry``/``timeout``
keys with the same defaults, documented once; one retry policy; one error form; and a sink's own
losses (``Sink.delivery_losses``) reaching ``SelfStats``, ``Loss`` events and the shutdown report."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from kafka_broker import TansuBroker, kafka_broker_fixture  # noqa: F401 - the fixture
from pipeline_helpers import MemorySink

import cuptistream
from cuptistream.config import BatchConfig, RetryConfig, SinkConfig, build, convert, registry
from cuptistream.config.units import parse_duration, parse_size
from cuptistream.delivery.retry import Backoff, RetriesExhausted, RetryableError, call_with_retry
from cuptistream.errors import ConfigError
from cuptistream.events import Kernel, Loss, SelfStats
from cuptistream.plugin import OutgoingBatch, Sink

ROOT = Path(__file__).resolve().parent.parent
CONFIG_MD = ROOT / "docs" / "config.md"
SHARED = ("queue", "batch", "retry", "timeout")
SINKS = registry.available(registry.SINK_GROUP)


def _default(field: msgspec.structs.FieldInfo) -> Any:
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return field.default


def _shared_fields(struct: type[msgspec.Struct]) -> dict[str, tuple[Any, Any]]:
    """Shared key -> (annotation, default) of a config Struct."""
    fields = {f.name: f for f in msgspec.structs.fields(struct)}
    return {key: (fields[key].type, _default(fields[key])) for key in SHARED if key in fields}


def _nested_defaults(value: Any, prefix: str) -> dict[str, Any]:
    """``queue.max_bytes`` -> 67108864 ...: the default of every key under a shared mapping."""
    if isinstance(value, msgspec.Struct):
        out: dict[str, Any] = {}
        for name in value.__struct_fields__:
            out.update(_nested_defaults(getattr(value, name), f"{prefix}.{name}"))
        return out
    return {prefix: value}


@pytest.mark.parametrize("name", SINKS)
def test_every_sink_has_the_shared_keys_with_the_same_names_and_defaults(name: str) -> None:
    config_type = registry.sink_class(name).config_type
    assert issubclass(config_type, SinkConfig)
    assert _shared_fields(config_type) == _shared_fields(SinkConfig), (
        f"sink {name!r} redefines a shared key; keep queue/batch/retry/timeout in SinkConfig"
    )
    assert set(_shared_fields(SinkConfig)) == set(SHARED)


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| `")]  # fmt: skip


def test_the_shared_keys_are_documented_once_with_their_defaults() -> None:
    text = CONFIG_MD.read_text(encoding="utf-8")
    section = text.split("## Keys every sink has", 1)[1].split("\n## ", 1)[0]
    everywhere = [row[0].strip("`") for row in _rows(text)]
    shared = SinkConfig(type="x")
    defaults = {
        **_nested_defaults(shared.queue, "queue"),
        **_nested_defaults(BatchConfig(), "batch"),  # a sink's batch: None until given, then these
        **_nested_defaults(shared.retry, "retry"),
    }
    for key in ["timeout", "queue", "batch", "retry", *defaults]:
        # pipeline.batch.* has rows of its own in the `pipeline` section: the same names, once there
        allowed = 2 if key.startswith("batch") else 1
        assert everywhere.count(key) == allowed, (
            f"docs/config.md: `{key}` must have one row, in 'Keys every sink has'"
        )
        assert f"| `{key}` |" in section, f"docs/config.md: `{key}` is not in 'Keys every sink has'"
    documented = {row[0].strip("`"): row[2] for row in _rows(section)}
    for key, value in defaults.items():
        cell = documented[key].strip("`")
        if isinstance(value, bool):
            assert cell == str(value).lower(), key
        elif key.endswith("max_bytes"):
            assert parse_size(cell) == value, key
        elif isinstance(value, float) and key != "retry.multiplier":
            assert parse_duration(cell) == pytest.approx(value), key
        else:
            assert str(value) == cell, key
    assert documented["timeout"] == "null: `10s`"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"type": "kafka", "request_timeout": "5s"}, "sinks[0].request_timeout: renamed to timeout; "),
        (
            {"type": "kafka", "delivery_timeout": "5s"},
            "sinks[0].delivery_timeout: renamed to retry.max_elapsed; ",
        ),
        (
            {"type": "kafka", "retry_backoff": "1s"},
            "sinks[0].retry_backoff: renamed to retry.initial_backoff; ",
        ),
        (
            {"type": "otlp", "endpoint": "http://h:4318", "deadline": "5s"},
            "sinks[0].deadline: renamed to retry.max_elapsed; ",
        ),
        (
            {"type": "file", "retry": {"max_backoff": "100ms"}},
            "sinks[0].retry: max_backoff must be at least 0.5, got 0.1",
        ),
        (
            {"type": "null", "retry": {"max_elapsed": 0}},
            "sinks[0].retry: max_elapsed must be more than 0, got 0",
        ),
        ({"type": "stdout", "timeout": 0}, "sinks[0]: timeout must be more than 0, got 0"),
        ({"type": "file", "retry": {"tries": 3}}, "sinks[0].retry.tries: unknown key (known keys: enabled, "),
    ],
)
def test_old_and_wrong_shared_keys_are_one_line_errors(entry: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build({"sinks": [entry]})
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)


def test_a_missing_secret_is_the_same_error_in_kafka_and_otlp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_SECRET", raising=False)
    config = build({"sinks": [
        {"type": "kafka", "bootstrap_servers": "127.0.0.1:1", "security_protocol": "SASL_PLAINTEXT",
         "sasl_mechanism": "PLAIN", "sasl_password_env": "NO_SUCH_SECRET"},
        {"type": "otlp", "endpoint": "http://127.0.0.1:1", "headers_env": {"X-Key": "NO_SUCH_SECRET"}},
    ]})  # fmt: skip
    messages = []
    for entry in config.sinks:
        sink = registry.sink_class(entry.type)(entry)
        with pytest.raises(ConfigError) as caught:
            trio.run(sink.open)
        messages.append(str(caught.value))
    assert messages == [
        "sinks[kafka].sasl_password_env: environment variable NO_SUCH_SECRET is not set; export the secret there",
        "sinks[otlp].headers_env.X-Key: environment variable NO_SUCH_SECRET is not set; export the secret there",
    ]


# --- the retry helper ---------------------------------------------------------------------------


def test_backoff_grows_with_jitter_up_to_the_cap_and_stops_at_the_deadline() -> None:
    policy = convert({"initial_backoff": "1s", "max_backoff": "4s", "multiplier": 2}, RetryConfig)
    backoff = Backoff(policy, deadline=100.0)
    waits = [backoff.wait(0.0) for _ in range(5)]
    for wait, nominal in zip(waits, [1, 2, 4, 4, 4], strict=True):
        assert wait is not None and nominal * 0.5 <= wait <= nominal
    assert backoff.wait(0.0, retry_after=7.0) == 7.0  # the server's Retry-After replaces the backoff
    assert backoff.wait(99.5) is None  # the wait would reach the deadline
    assert backoff.wait(0.0, retry_after=150.0) is None
    assert Backoff(convert({"enabled": False}, RetryConfig)).wait(0.0) is None
    assert Backoff(policy).deadline == math.inf


def test_call_with_retry_honours_retry_after_and_one_deadline() -> None:
    policy = convert({"initial_backoff": "20s", "max_backoff": "20s", "max_elapsed": "10s"}, RetryConfig)
    calls: list[float] = []

    async def attempt(timeout: float) -> str:
        calls.append(trio.current_time())
        if len(calls) < 3:
            raise RetryableError("HTTP 503", retry_after=0.2)
        return "ok"

    async def main() -> None:
        assert await call_with_retry(attempt, policy, 1.0, trio.current_time() + 10) == "ok"
        calls.clear()

        async def always(timeout: float) -> str:
            raise RetryableError("ConnectError")

        started = trio.current_time()
        quick = convert({"initial_backoff": "50ms", "max_elapsed": "1s"}, RetryConfig)
        with pytest.raises(RetriesExhausted, match=r"^deadline \(last: ConnectError\)$"):
            await call_with_retry(always, quick, 1.0, started + 0.5)
        assert trio.current_time() - started < 0.6

    trio.run(main)


# --- a sink's own losses reach the pipeline's accounting ---------------------------------------


class _LosingSink(Sink):
    """Accepts every batch, then (as Kafka does after an outage) reports some of it lost."""

    def __init__(self) -> None:
        super().__init__(SinkConfig(type="losing", name="losing"))
        self.accepted = 0

    async def write(self, batch: OutgoingBatch) -> None:
        self.accepted += batch.event_count

    def stats(self) -> dict[str, int]:
        return {"accepted": self.accepted}

    def delivery_losses(self) -> dict[str, int]:
        return {"retries_exhausted": self.accepted // 2} if self.accepted else {}


def test_delivery_losses_become_loss_events_self_stats_and_the_report() -> None:
    sink, witness = _LosingSink(), MemorySink("witness")
    config = {
        "pipeline": {"batch": {"max_latency": "20ms"}, "stats_interval": "50ms"},
        "sinks": [{"type": "null"}],
    }
    with cuptistream.session(config, sinks=[sink, witness], quiet=True) as session:
        session.emitter.emit([Kernel(start=i, end=i + 1, name="k", device_id=0, context_id=1, stream_id=1,
                                     correlation_id=i) for i in range(1000)])  # fmt: skip
        time.sleep(0.5)
    report = session.report
    assert report is not None
    lost = sink.delivery_losses()["retries_exhausted"]
    assert lost > 0
    assert report.losses["sink:losing/retries_exhausted"] == lost
    stage = report.sinks["losing"]
    assert stage.events_dropped == lost and stage.events_out == sink.accepted - lost
    assert stage.counters == {"accepted": sink.accepted}
    events = [e for b in witness.batches for e in b.events]
    assert sum(e.count for e in events if isinstance(e, Loss) and e.reason == "retries_exhausted") > 0
    stats = [e for e in events if isinstance(e, SelfStats)]
    assert stats[-1].stages["sink:losing"].events_dropped > 0
    assert stats[-1].stages["sink:losing"].counters["accepted"] > 0


def test_kafka_losses_after_acceptance_reach_self_stats_loss_events_and_the_report(
    kafka_broker: TansuBroker,
) -> None:
    """The broker stops after writes were accepted; block mode gives the
    messages up after retry.max_elapsed; every one of them is in SelfStats, a Loss event and the
    shutdown report, with the reason the Kafka sink gives."""
    from cuptistream.sinks.kafka import KafkaSink, KafkaSinkConfig

    entry = {"type": "kafka", "name": "kafka", "bootstrap_servers": kafka_broker.bootstrap, "topic": "gpu",
             "connect_timeout": "3s", "timeout": "500ms", "retry": {"max_elapsed": "1s"}}  # fmt: skip
    kafka = KafkaSink(convert(entry, KafkaSinkConfig, "sinks[0]"))
    witness = MemorySink("witness")
    config = {
        "pipeline": {"batch": {"max_events": 500, "max_latency": "50ms"}, "stats_interval": "200ms",
                     "shutdown_deadline": "5s"},
        "sinks": [{"type": "null"}],
    }  # fmt: skip

    def emit(session: cuptistream.Session, first: int) -> None:
        session.emitter.emit([Kernel(start=i, end=i + 1, name="k", device_id=0, context_id=1, stream_id=1,
                                     correlation_id=i) for i in range(first, first + 2000)])  # fmt: skip

    try:
        with cuptistream.session(config, sinks=[kafka, witness], quiet=True) as session:
            emit(session, 1)
            deadline = time.monotonic() + 10
            while kafka.stats()["acked_events"] < 2000 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert kafka.stats()["acked_events"] >= 2000, "the broker never acked the first events"
            kafka_broker.pause()  # SIGSTOP: the broker hangs; the sink still accepts what fits
            emit(session, 2001)
            deadline = time.monotonic() + 15
            while not kafka.delivery_losses().get("retries_exhausted") and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.6)  # at least two stats intervals: the Loss and SelfStats reach the witness
    finally:
        kafka_broker.resume()
    report = session.report
    assert report is not None
    losses = kafka.delivery_losses()
    expired = losses.get("retries_exhausted", 0)
    assert expired > 0, f"nothing was given up after the broker stopped: {kafka.stats()}"

    # Loss events, as every sink's stream carries them.
    events = [e for b in witness.batches for e in b.events]
    in_loss_events = sum(e.count for e in events if isinstance(e, Loss)
                         and (e.stage, e.reason) == ("sink:kafka", "retries_exhausted"))  # fmt: skip
    assert in_loss_events > 0
    # SelfStats: the Kafka stage's events_dropped and the sink's own counters.
    stats = [e.stages["sink:kafka"] for e in events if isinstance(e, SelfStats)]
    assert max(s.events_dropped for s in stats) >= in_loss_events
    assert max(s.counters.get("dropped_events", 0) for s in stats) > 0
    # The shutdown report: every loss, by reason, and the stage's ledger closes.
    for reason, count in losses.items():
        assert report.losses[f"sink:kafka/{reason}"] == count
    stage = report.sinks["kafka"]
    assert stage.events_dropped == sum(losses.values()) == kafka.stats()["dropped_events"]
    assert stage.counters["dropped_events"] == stage.events_dropped
    assert stage.events_in == stage.events_out + stage.events_dropped
    # Block mode spools nothing: what was accepted and not lost is what the broker acked.
    assert stage.events_spooled == 0
    assert stage.events_delivered == stage.events_out == kafka.stats()["acked_events"]
    assert f"kafka: {stage.events_delivered} delivered, {stage.events_dropped} dropped" in report.summary()
