"""The stdout sink (in a real child process, read through a real pipe) and the null sink."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.batchgen import outgoing, run_sink

from cuptistream.config import convert
from cuptistream.recording import jsonl
from cuptistream.sinks.null import NullSink, NullSinkConfig

CHILD = Path(__file__).parent / "helpers" / "stdout_sink_child.py"


def test_stdout_sink_output_parses_back_into_the_batches() -> None:
    done = subprocess.run([sys.executable, str(CHILD), "4"], capture_output=True, timeout=60, check=True)
    lines = done.stdout.splitlines()
    assert len(lines) == 4 * (1 + 25)  # an envelope line and 25 event lines per batch
    parsed = [json.loads(line) for line in lines]  # every line is plain JSON
    assert [p["type"] for p in parsed[::26]] == ["batch"] * 4
    batches = list(jsonl.iter_batches(done.stdout))
    assert batches == [outgoing(seq, 25, kinds=True).batch for seq in range(4)]
    assert f"'bytes_written': {len(done.stdout)}" in done.stderr.decode()


def test_stdout_sink_reports_a_closed_pipe_as_a_delivery_error() -> None:
    child = subprocess.Popen(
        [sys.executable, str(CHILD), "-1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None and child.stderr is not None
    first = child.stdout.readline()
    assert json.loads(first)["type"] == "batch"
    child.stdout.close()  # the reader goes away, like `| head -1`
    try:
        errors = child.stderr.read().decode()
        child.wait(timeout=30)
    finally:
        child.kill()
    assert child.returncode == 0, errors
    assert "DeliveryError: sinks[stdout]: cannot write to stdout" in errors
    assert "Traceback" not in errors


def test_null_sink_counts_events_and_bytes() -> None:
    sink = NullSink(convert({"type": "null"}, NullSinkConfig, "sinks[0]"))
    batches = [outgoing(seq, count) for seq, count in enumerate([10, 0, 7])]
    run_sink(sink, batches)
    assert sink.stats() == {"batches": 3, "events": 17, "bytes": sum(len(b.data) for b in batches)}
