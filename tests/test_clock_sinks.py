"""Every time a sink emits is Unix-epoch ns, whatever the source (issue 14, clocks): a real session
per source feeds the file sink, the OTLP sink (the real receiver) and the Kafka sink with
``value_format: jsonl`` (a real tansu broker), and every time read back lands within an hour of when
the data was captured.

* ``replay``, and the ``activity`` decoder it shares: the committed H200 captures
  (tests/fixtures/*.cupti, 2026-11-21). The capture time is read from the captures themselves
  (their CUPTI timestamps are on the Unix clock), independently of any sink.
* ``synthetic``: generated now, so now is the capture time.

The live ``activity``, ``callbacks``, ``state``, ``pc_sampling`` and ``sass`` sources need a GPU to
run: their clock (CUPTI's ``cuptiGetTimestamp`` paired with the Unix clock) is exercised by the GPU
tests; the committed sampling fixtures hold samples without times (the source stamps them when it
drains), so there is nothing in them for a sink to date.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any

from kafka_broker import TansuBroker, kafka_broker_fixture  # noqa: F401 - the fixture

import cuptistream
from cuptistream.events import Kernel
from tests.otlp_receiver import OtlpReceiver
from tests.test_kafka_jsonl import consume
from tests.test_otlp import attrs

FIXTURES = Path(__file__).parent / "fixtures"
HOUR = 3600 * 10**9
CAPTURE_DAY = datetime.datetime(2026, 11, 21, tzinfo=datetime.timezone.utc)


def run_session(source: dict[str, Any], out: Path, receiver: OtlpReceiver, broker: TansuBroker) -> None:
    cfg = {
        "sources": [source],
        "sinks": [
            {"type": "file", "directory": str(out)},
            {"type": "otlp", "name": "otlp", "endpoint": receiver.endpoint, "reorder_window": "100ms"},
            {"type": "kafka", "name": "kafka", "bootstrap_servers": broker.bootstrap, "topic": "clock",
             "value_format": "jsonl", "connect_timeout": "5s"},
        ],
    }  # fmt: skip
    with cuptistream.session(cfg, quiet=True):
        pass


def sink_times(out: Path, receiver: OtlpReceiver, broker: TansuBroker) -> dict[str, list[int]]:
    """Kernel times as each sink delivered them, in epoch ns."""
    file_times = [
        t
        for batch in cuptistream.read(out).batches()
        for event in batch.events
        if isinstance(event, Kernel)
        for t in (event.start + batch.clock.offset_ns, event.end + batch.clock.offset_ns)
    ]
    otlp_times = [
        t
        for span in receiver.spans()
        if attrs(span)["cuda.activity.kind"] == "kernel"
        for t in (span.start_time_unix_nano, span.end_time_unix_nano)
    ]
    kafka_times = [
        t
        for record in consume(broker.bootstrap, "clock")
        for line in record.value.splitlines()
        if (row := json.loads(line))["type"] == "kernel"
        for t in (row["start"], row["end"])
    ]
    return {"file": file_times, "otlp": otlp_times, "kafka jsonl": kafka_times}


def assert_near(times: dict[str, list[int]], reference: int, kernels: int) -> None:
    for sink, values in times.items():
        assert len(values) == 2 * kernels, f"{sink}: {len(values) // 2} kernels, expected {kernels}"
        worst = max(abs(t - reference) for t in values)
        assert worst < HOUR, f"{sink}: a time {worst / 1e9:.0f} s away from the capture"


def test_replayed_captures_are_dated_when_they_were_captured(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    from tests.test_otlp_fixtures import replayed_events

    captured = [e.start for e in replayed_events() if isinstance(e, Kernel)]  # the captures' own times
    reference = min(captured)
    assert CAPTURE_DAY.timestamp() * 1e9 <= reference < CAPTURE_DAY.timestamp() * 1e9 + 24 * HOUR
    with OtlpReceiver() as receiver:
        run_session({"type": "replay", "path": str(FIXTURES)}, tmp_path / "out", receiver, kafka_broker)
        times = sink_times(tmp_path / "out", receiver, kafka_broker)
    assert_near(times, reference, len(captured))
    assert sorted(times["otlp"][::2]) == sorted(times["kafka jsonl"][::2]) == sorted(times["file"][::2])


def test_synthetic_events_are_dated_now(kafka_broker: TansuBroker, tmp_path: Path) -> None:
    now = time.time_ns()
    with OtlpReceiver() as receiver:
        run_session({"type": "synthetic", "events": 2000}, tmp_path / "out", receiver, kafka_broker)
        times = sink_times(tmp_path / "out", receiver, kafka_broker)
    assert_near(times, now, 2000)
