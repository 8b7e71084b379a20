"""The live status line: drawn in place on a pseudo-terminal, absent when the stream is not a TTY
or with --quiet. A real Collector (null sink) provides the counters."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import cuptistream
from cuptistream.collector.collector import Collector
from cuptistream.collector.status import StatusLine
from cuptistream.events import Kernel


@pytest.fixture
def collector() -> Collector:
    cfg = cuptistream.load_config({"sources": [], "sinks": [{"type": "null"}]})
    running = Collector(cfg).start()
    yield running
    running.finish(probe_timeout=0)


def _kernels(n: int) -> list[Kernel]:
    return [Kernel(start=i, end=i + 5, name="k", device_id=0, context_id=1, stream_id=7, correlation_id=i)
            for i in range(n)]  # fmt: skip


def _read_all(fd: int, wait: float) -> str:
    out = b""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
    return out.decode()


def test_status_line_redraws_in_place_on_a_pty(collector: Collector) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # 160 columns
    stream = os.fdopen(slave, "w", encoding="utf-8")
    try:
        line = StatusLine.for_stream(collector, stream, interval=0.05)
        assert line is not None
        collector.pipeline.intake.emit(_kernels(3000))
        collector.pipeline.intake.report_error("source:test", "made up")
        text = _read_all(master, 0.6)
        line.stop()
        text += _read_all(master, 0.2)
    finally:
        stream.close()
        os.close(master)
    draws = text.split("\r\x1b[K")
    assert len(draws) >= 4, text  # redrawn, each time from column 0 over the previous line
    assert "\n" not in text  # one line, never scrolls
    last = [d for d in draws if d][-1]
    assert "3,001 events" in last or "3,000 events" in last, last
    assert "1 errors" in last and "0 dropped" in last and "sinks: null ok" in last
    assert "events/s" in last
    assert text.endswith("\r\x1b[K")  # erased at stop, so the summary line starts clean


def test_status_line_fits_the_terminal(collector: Collector) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    with os.fdopen(slave, "w", encoding="utf-8") as stream:
        line = StatusLine(collector, stream)
        line.draw()
        text = _read_all(master, 0.2)
    os.close(master)
    assert len(text.removeprefix("\r\x1b[K")) == 39 and text.endswith("…")


def test_no_status_line_without_a_terminal_or_when_quiet(collector: Collector) -> None:
    buffer = io.StringIO()
    assert StatusLine.for_stream(collector, buffer) is None
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as pipe:
        assert StatusLine.for_stream(collector, pipe) is None
    os.close(read_end)
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as tty:
        assert StatusLine.for_stream(collector, tty, quiet=True) is None
    os.close(master)
    assert buffer.getvalue() == ""


def test_render_counts_drops_and_rate(collector: Collector) -> None:
    times = iter([0.0, 2.0])
    line = StatusLine(collector, io.StringIO(), clock=lambda: next(times))
    line.render()
    collector.pipeline.intake.emit(_kernels(100))
    collector.pipeline.intake.report_loss("cupti", "cupti_buffer_dropped", 42)
    text = line.render()
    assert "42 dropped" in text and "50 events/s" in text


def _run_cli(tmp_path: Path, stderr_tty: bool) -> str:
    tmp_path.mkdir()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "sources:\n  - {type: synthetic, events: 200000, rate: 100000}\n"
        f"sinks:\n  - {{type: file, directory: {tmp_path / 'out'}}}\n"
    )
    argv = [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(cfg), "--",
            "python", "-c", "import time; time.sleep(1.5)"]  # fmt: skip
    if not stderr_tty:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif child.poll() is not None:
            break
    child.wait(timeout=60)
    os.close(master)
    return out.decode(errors="replace")


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_cuptistream_run_shows_the_line_only_on_a_terminal(tmp_path: Path) -> None:
    on_tty = _run_cli(tmp_path / "tty", stderr_tty=True)
    assert "\r\x1b[Kcuptistream: " in on_tty and "events/s" in on_tty and "sinks: file" in on_tty, on_tty
    assert "drained:" in on_tty.split("\r\x1b[K")[-1]  # erased, then the summary on a clean line
    piped = _run_cli(tmp_path / "pipe", stderr_tty=False)
    assert "\x1b[K" not in piped and "events/s" not in piped and "drained:" in piped
