"""Broker outages while a real session produces (synthetic source -> Kafka sink, in a child process).

- ``spool`` mode, broker SIGSTOPped for 10 s (it keeps its data): every event arrives, duplicates
  are counted, and the child's RSS stays within the configured budgets.
- ``spool`` mode, broker killed and restarted 10 s later: memory storage forgets everything written
  before the kill, so the proof is that every event from the first surviving one on arrives,
  including all produced while the broker was dead.
- ``block`` mode, in-process: the lane's ``drop_newest`` policy decides, and every event emitted is
  either in Kafka or counted as dropped, exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka_broker import TansuBroker, kafka_broker_fixture  # noqa: F401 - the fixture

import cuptistream
from cuptistream.config import convert
from cuptistream.events import Kernel
from cuptistream.recording.kafka_reader import iter_kafka_messages
from cuptistream.sinks.kafka import KafkaSink, KafkaSinkConfig

pytestmark = pytest.mark.slow  # scripts/test.sh --all and CI run it

CHILD = Path(__file__).with_name("kafka_producer_child.py")
MiB = 1024 * 1024
# The child's configured budgets (kafka_producer_child.py): pipeline 32 MiB + in flight 8 MiB, and,
# because its collector is embedded in the same process, the probe's queue 8 MiB + its 8 MiB of
# event buffers (mapped twice: by the probe and by the collector), plus room for kafka-python's
# compression buffers and allocator slack.
RSS_GROWTH_LIMIT = (32 + 8 + 8 + 2 * 8 + 40) * MiB


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):  # the child exited before or while it was read
        pass
    return 0


def run_child(
    broker: TansuBroker, mode: str, spool: Path, seconds: float, rate: int, fault: Callable[[], None]
) -> tuple[dict[str, Any], int]:
    """Run the producing child, apply ``fault`` while it runs; return its report and RSS growth."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(CHILD.parent.parent), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, str(CHILD), broker.bootstrap, mode, str(spool), str(seconds), str(rate)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "started"
    baseline = _rss(child.pid)
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], _rss(child.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        fault()
        out, _ = child.communicate(timeout=150)
    finally:
        done.set()
        sampler.join()
        child.kill()
    assert child.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1]), peak[0] - baseline


def kernel_ids(broker: TansuBroker) -> tuple[list[int], int]:
    """Correlation ids of every Kernel in the topic (with duplicates), and the message count."""
    ids: list[int] = []
    messages = 0
    for message in iter_kafka_messages(f"kafka://{broker.bootstrap}/gpu", timeout_s=15):
        messages += 1
        ids.extend(e.correlation_id for e in message.batch.events if isinstance(e, Kernel))
    return ids, messages


def test_spool_mode_survives_a_stopped_broker(kafka_broker: TansuBroker, tmp_path: Path) -> None:
    def outage() -> None:
        time.sleep(3)
        kafka_broker.pause()
        time.sleep(10)
        kafka_broker.resume()

    report, rss_growth = run_child(kafka_broker, "spool", tmp_path / "spool", 16, 40_000, outage)
    stats = report["stats"]
    print(f"spool/SIGSTOP: {report}; RSS growth {rss_growth / MiB:.1f} MiB")
    assert report["intake_dropped"] == report["events_dropped"] == stats["dropped_events"] == 0
    assert not report["deadline_hit"] and stats["undelivered_events"] == 0
    assert stats["spooled_messages"] > 0, "the outage did not reach the spool; the test proves nothing"
    assert stats["replayed_messages"] == stats["spooled_messages"]
    assert stats["spool_bytes"] == 0 and not list((tmp_path / "spool").glob("spool-*"))

    ids, _ = kernel_ids(kafka_broker)
    generated = report["events_in"]
    assert generated > 400_000
    assert set(ids) == set(range(1, generated + 1)), "every event produced must arrive"
    duplicates = len(ids) - len(set(ids))
    print(f"duplicates (at-least-once): {duplicates} events")
    assert rss_growth < RSS_GROWTH_LIMIT


def test_spool_mode_delivers_everything_after_a_broker_restart(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    def kill_and_restart() -> None:
        time.sleep(3)
        kafka_broker.kill()
        time.sleep(10)
        kafka_broker.start()  # same port; memory storage starts empty

    rate = 30_000
    report, rss_growth = run_child(kafka_broker, "spool", tmp_path / "spool", 16, rate, kill_and_restart)
    stats = report["stats"]
    print(f"spool/kill+restart: {report}; RSS growth {rss_growth / MiB:.1f} MiB")
    assert report["intake_dropped"] == report["events_dropped"] == stats["dropped_events"] == 0
    assert stats["spooled_messages"] > 0 and stats["replayed_messages"] == stats["spooled_messages"]

    ids, _ = kernel_ids(kafka_broker)
    generated = report["events_in"]
    first = min(ids)
    # Everything from the first surviving event to the last arrived: what was produced while the
    # broker was dead and after it came back. Only what it had acked before the kill is gone.
    assert set(ids) == set(range(first, generated + 1))
    assert first - 1 <= rate * 4, "more was lost than the broker could have acked before the kill"
    print(f"lost with the broker's memory: {first - 1} events; duplicates: {len(ids) - len(set(ids))}")
    assert rss_growth < RSS_GROWTH_LIMIT


def test_block_mode_counts_every_drop_exactly(kafka_broker: TansuBroker) -> None:
    entry = {
        "type": "kafka",
        "name": "kafka",
        "bootstrap_servers": kafka_broker.bootstrap,
        "topic": "gpu",
        "max_in_flight_bytes": "1MiB",
        "queue": {"max_bytes": "1MiB", "full_policy": "drop_newest"},
    }
    sink = KafkaSink(convert(entry, KafkaSinkConfig, "sinks[0]"))
    config = {
        "pipeline": {"full_policy": "block", "batch": {"max_events": 2000, "max_latency": "50ms"}},
        "sinks": [{"type": "null"}],
    }
    emitted = 0
    with cuptistream.session(config, sinks=[sink], quiet=True) as session:
        for phase in ("before", "outage", "after"):
            if phase == "outage":
                kafka_broker.pause()
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                session.emitter.emit(
                    [
                        Kernel(
                            start=i,
                            end=i + 1,
                            name="k",
                            device_id=0,
                            context_id=1,
                            stream_id=1,
                            correlation_id=i,
                        )
                        for i in range(emitted + 1, emitted + 501)
                    ]
                )
                emitted += 500
                time.sleep(0.002)
            if phase == "outage":
                kafka_broker.resume()
    report = session.report
    assert report is not None
    ids, _ = kernel_ids(kafka_broker)
    dropped = report.sinks["kafka"].events_dropped
    print(f"block: emitted {emitted}, in kafka {len(set(ids))}, dropped by the lane {dropped}")
    assert dropped > 0, "the outage caused no drops; the test proves nothing"
    assert report.intake_dropped == 0 and sink.stats()["dropped_events"] == 0
    assert len(ids) == len(set(ids)) == emitted - dropped
    assert set(ids) <= set(range(1, emitted + 1))
    assert report.sinks["kafka"].events_out == emitted - dropped + _accounting_events(report)


def _accounting_events(report: Any) -> int:
    """Loss and SelfStats events the pipeline adds to the sink's stream (not Kernels)."""
    return int(report.sinks["kafka"].events_in - report.events_in)


@pytest.fixture(autouse=True)
def _quiet_kafka_logs() -> None:
    import logging

    logging.getLogger("kafka").setLevel(logging.CRITICAL)
