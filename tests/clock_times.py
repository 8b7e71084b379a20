"""Every time a session's sinks delivered, read back as each sink's consumer would, in Unix-epoch ns.
Shared by the CPU tests (tests/test_clock_sinks.py: replay, synthetic) and the GPU
tests (tests/gpu/test_clocks_gpu.py: activity, callbacks, state, pc_sampling, sass).

Each reader returns ``{key: [times]}``: the file sink and Kafka ``jsonl`` by event type (``kernel``,
``api``, ``error``, ...), OTLP by what carried the time (``span:<cuda.activity.kind>``, ``log``,
``metric:<name>``, ``profile``). Times keep their order within an event (a kernel's start, then its
end), so ``times[::2]`` of a key whose events have a start and an end are the starts.

Which fields are times is decided here, independently of the code under test: every field named
``start``, ``end``, ``timestamp``, ``device_timestamp``, ``since`` or ``until``. In the file format
they are on the event clock (add the batch's ``clock.offset_ns``), except ``Loss`` and ``SelfStats``,
whose times are epoch ns already (docs/events.md); ``device_timestamp`` 0 means "not reported".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cuptistream

HOUR = 3600 * 10**9
TIME_FIELDS = ("start", "end", "timestamp", "device_timestamp", "since", "until")
EPOCH_IN_FILES = frozenset({"loss", "self_stats"})  # event types whose file times are epoch ns already


def sinks_config(
    out: Path, otlp_endpoint: str, bootstrap: str | None, topic: str, signals: list[str] | None = None
) -> list[dict[str, Any]]:
    """File, OTLP (a short reorder window) and, where a broker is given, Kafka ``jsonl``."""
    otlp: dict[str, Any] = {
        "type": "otlp",
        "name": "otlp",
        "endpoint": otlp_endpoint,
        "reorder_window": "100ms",
    }
    if signals:
        otlp["signals"] = signals
    sinks: list[dict[str, Any]] = [{"type": "file", "directory": str(out)}, otlp]
    if bootstrap is not None:
        sinks.append({"type": "kafka", "name": "kafka", "bootstrap_servers": bootstrap, "topic": topic,
                      "value_format": "jsonl", "connect_timeout": "5s"})  # fmt: skip
    return sinks


def _add(times: dict[str, list[int]], key: str, values: list[int]) -> None:
    times.setdefault(key, []).extend(values)


def file_times(out: Path) -> dict[str, list[int]]:
    """Times of the file sink's events, by event type, resolved with each batch's clock offset."""
    times: dict[str, list[int]] = {}
    for batch in cuptistream.read(out).batches():
        offset = batch.clock.offset_ns
        for event in batch.events:
            tag = type(event).__struct_config__.tag
            assert isinstance(tag, str)
            shift = 0 if tag in EPOCH_IN_FILES else offset
            values = [
                getattr(event, name) + shift
                for name in event.__struct_fields__
                if name in TIME_FIELDS and not (name == "device_timestamp" and not getattr(event, name))
            ]
            _add(times, tag, values)
    return times


def kafka_rows(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every row of a ``value_format: jsonl`` topic, as ``json`` reads them."""
    from tests.kafka_consume import consume  # needs kafka-python: imported where Kafka is used

    return [json.loads(line) for record in consume(bootstrap, topic) for line in record.value.splitlines()]


def row_times(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Times of Kafka ``jsonl`` rows, by event type."""
    times: dict[str, list[int]] = {}
    for row in rows:
        values = [
            value
            for name, value in row.items()
            if name in TIME_FIELDS and not (name == "device_timestamp" and not value)
        ]
        _add(times, row["type"], values)
    return times


def kafka_times(bootstrap: str, topic: str) -> dict[str, list[int]]:
    """Times of the rows of a ``value_format: jsonl`` topic, by event type."""
    return row_times(kafka_rows(bootstrap, topic))


def _attribute(obj: Any, key: str) -> Any:
    for kv in obj.attributes:
        if kv.key == key:
            return getattr(kv.value, kv.value.WhichOneof("value"))
    return None


def otlp_times(receiver: Any) -> dict[str, list[int]]:
    """Times of everything a ``tests.otlp_receiver.OtlpReceiver`` decoded: span start/end, log
    record time/observed time, metric point time/start time (0 = unset, on gauges) and profile
    time/end."""
    times: dict[str, list[int]] = {}
    for span in receiver.spans():
        _add(
            times,
            f"span:{_attribute(span, 'cuda.activity.kind')}",
            [span.start_time_unix_nano, span.end_time_unix_nano],
        )
    for record in receiver.log_records():
        _add(times, "log", [record.time_unix_nano, record.observed_time_unix_nano])
    for message in receiver.messages("/v1/metrics"):
        for rm in message.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    points = metric.sum.data_points if metric.HasField("sum") else metric.gauge.data_points
                    for point in points:
                        values = [point.time_unix_nano]
                        if point.start_time_unix_nano:
                            values.append(point.start_time_unix_nano)
                        _add(times, f"metric:{metric.name}", values)
    for message in receiver.messages("/v1development/profiles"):
        for rp in message.resource_profiles:
            for sp in rp.scope_profiles:
                for profile in sp.profiles:
                    _add(
                        times,
                        "profile",
                        [profile.time_unix_nano, profile.time_unix_nano + profile.duration_nano],
                    )
    return times


def far_from(times: dict[str, list[int]], reference: int, within: int = HOUR) -> dict[str, float]:
    """Keys with a time more than ``within`` from ``reference``: the worst distance, in seconds."""
    return {
        key: max(abs(t - reference) for t in values) / 1e9
        for key, values in times.items()
        if values and max(abs(t - reference) for t in values) >= within
    }


def spread(times: dict[str, list[int]], reference: int) -> dict[str, dict[str, float | int]]:
    """Per key: how many times, and the earliest and latest relative to ``reference`` (seconds)."""
    return {
        key: {
            "times": len(values),
            "first_s": (min(values) - reference) / 1e9,
            "last_s": (max(values) - reference) / 1e9,
        }
        for key, values in sorted(times.items())
        if values
    }
