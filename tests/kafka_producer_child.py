"""A child process for Kafka outage tests: a real session (synthetic source -> Kafka sink).

Run as ``python tests/kafka_producer_child.py BOOTSTRAP MODE SPOOL_DIR SECONDS RATE``. It prints
``started`` once the sink is open, then, after the session has drained, one JSON line with the
shutdown report and the sink's stats. The parent samples this process's RSS and breaks the broker.
"""

from __future__ import annotations

import json
import logging
import sys

import cuptistream
from cuptistream.config import convert
from cuptistream.sinks.kafka import KafkaSink, KafkaSinkConfig

PIPELINE_BUDGET = "32MiB"
PROBE_BUDGET = "8MiB"  # the probe's queue, in this process too (the collector is embedded)
QUEUE_BYTES = "16MiB"
IN_FLIGHT_BYTES = "8MiB"


def main() -> None:
    bootstrap, mode, spool_dir, seconds, rate = sys.argv[1:6]
    logging.basicConfig(level=logging.CRITICAL)  # kafka-python is loud while the broker is away
    sink_entry = {
        "type": "kafka",
        "name": "kafka",
        "bootstrap_servers": bootstrap,
        "topic": "gpu",
        "on_unavailable": mode,
        "spool_directory": spool_dir,
        "spool_after": "300ms",
        "spool_segment_bytes": "1MiB",
        "max_in_flight_bytes": IN_FLIGHT_BYTES,
        "timeout": "5s",
        "retry": {"max_elapsed": "30s", "initial_backoff": "200ms", "max_backoff": "2s"},
        "queue": {"max_bytes": QUEUE_BYTES, "full_policy": "block"},
    }
    sink = KafkaSink(convert(sink_entry, KafkaSinkConfig, "sinks[0]"))
    config = {
        "pipeline": {
            "memory_budget": PIPELINE_BUDGET,
            "full_policy": "block",
            "batch": {"max_events": 4000, "max_latency": "100ms"},
            "stats_interval": "1s",
            "shutdown_deadline": "60s",
        },
        "probe": {"memory_budget": PROBE_BUDGET},
        "sources": [{"type": "synthetic", "events": 0, "rate": float(rate), "duration": float(seconds)}],
        "sinks": [{"type": "null"}],  # replaced by the Kafka sink built above
    }
    with cuptistream.session(config, sinks=[sink], quiet=True) as session:
        print("started", flush=True)
        for source in session.sources:
            source.wait()  # type: ignore[attr-defined]
    report = session.report
    assert report is not None
    out = {
        "events_in": report.events_in,
        "intake_dropped": report.intake_dropped,
        "events_out": report.sinks["kafka"].events_out,
        "events_dropped": report.sinks["kafka"].events_dropped,
        "deadline_hit": report.deadline_hit,
        "stats": sink.stats(),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
