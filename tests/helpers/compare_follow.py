"""``cuptistream compare URL --follow`` run as the user runs it (a child process), stopped with Ctrl-C
once it prints its first "became an outlier" line: the tests of raw records and of the statistics'
rows on a Kafka topic check the same follow loop, so they share how it is driven."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class FollowRun:
    until_outlier: list[str]  # the lines up to and including the first "became an outlier" line
    after: list[str]  # the lines printed after it, up to the exit (the whole span's report)
    code: int
    stderr: str


def follow_until_outlier(url: str) -> FollowRun:
    """Follow ``url`` with 1 s intervals, read lines until one says a rank became an outlier (30 s at
    most for each line), then Ctrl-C the child and collect the rest of its output."""
    child = subprocess.Popen(
        [sys.executable, "-m", "cuptistream.cli", "compare", url, "--follow", "--interval", "1s"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()

    def read_stdout() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    seen: list[str] = []
    try:  # the interval closes once the topic is idle and the Unix clock is past it
        while not any("became an outlier" in line for line in seen):
            seen.append(lines.get(timeout=30))
    finally:
        child.send_signal(signal.SIGINT)
        code = child.wait(timeout=30)
    reader.join(timeout=10)
    after = []
    while not lines.empty():
        after.append(lines.get())
    stderr = child.stderr.read() if child.stderr else ""
    return FollowRun(seen, after, code, stderr)
