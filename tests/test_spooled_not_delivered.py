"""Spooled is not delivered: a Kafka sink in ``on_unavailable: spool`` mode whose broker never comes
up writes every event to its spool, and the shutdown summary line and ``--report-json`` say so:
0 delivered, N spooled. A real ``cuptistream run`` in a subprocess, against a closed local port."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "cuptistream.cli"]
EVENTS = 1000


def _closed_port() -> int:
    """A loopback port nothing listens on (bound once to pick it, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_spooling_kafka_sink_reports_spooled_events_and_none_delivered(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    config = tmp_path / "cfg.yaml"
    config.write_text(
        f"sources:\n  - {{type: synthetic, events: {EVENTS}}}\n"
        "sinks:\n"
        f"  - {{type: kafka, bootstrap_servers: ['127.0.0.1:{_closed_port()}'], on_unavailable: spool,\n"
        f"      spool_directory: '{spool}', spool_after: 100ms, connect_timeout: 1s,\n"
        "      retry: {max_elapsed: 1s}}\n"
        "pipeline: {shutdown_deadline: 10s}\n"
    )
    report_path = tmp_path / "report.json"
    result = subprocess.run(
        [*CLI, "run", "-c", str(config), "--report-json", str(report_path), "--", sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr

    kafka = json.loads(report_path.read_bytes())["sinks"]["kafka"]
    assert kafka["counters"]["acked_events"] == 0
    spooled = kafka["counters"]["spooled_events"]
    assert spooled >= EVENTS  # the synthetic events, and the accounting events after them
    assert kafka["events_delivered"] == 0
    assert kafka["events_spooled"] == spooled == kafka["events_out"]
    assert kafka["events_dropped"] == 0

    line = re.search(r"kafka: (\d+) delivered, (\d+) spooled, (\d+) dropped", result.stderr)
    assert line, result.stderr
    assert (int(line.group(1)), int(line.group(2)), int(line.group(3))) == (0, spooled, 0)
    assert any(spool.glob("spool*.kafka.zst")), "the spool holds nothing on disk"
