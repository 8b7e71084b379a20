"""The live status line of ``cuptistream run``: one line on a terminal, redrawn in place.

    cuptistream: 12.4k events/s · 1,204 batches · 0 dropped · 0 errors · sinks: file ok, otlp failing

``StatusLine.for_stream`` returns None unless the stream is a terminal (and not ``--quiet``), so
pipes, files and CI logs never get carriage returns. The line is drawn from a daemon thread that
only reads counters (the intake's, each lane's ``snapshot()``, each sink's ``stats()``); a failed
read skips one redraw and never disturbs the collector. ``stop()`` erases the line so the shutdown
summary starts on a clean line.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from cuptistream.collector.collector import Collector

_CLEAR = "\r\x1b[K"  # back to column 0, erase to the end of the line


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def _count(n: float) -> str:
    if n >= 10_000_000:
        return f"{n / 1e6:.0f}M"
    if n >= 10_000:
        return f"{n / 1e3:.1f}k"
    return f"{n:,.0f}"


class StatusLine:
    """Redraws ``collector``'s counters on ``stream`` every ``interval`` seconds until ``stop()``."""

    def __init__(
        self, collector: Collector, stream: TextIO, *, interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.collector = collector
        self.stream = stream
        self.interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: tuple[float, int] | None = None  # (time, events in) at the previous draw
        self._rate = 0.0
        self._drops = 0
        self._lane_drops: dict[str, int] = {}
        self.draws = 0

    @classmethod
    def for_stream(
        cls, collector: Collector, stream: TextIO, *, quiet: bool = False, interval: float = 0.5
    ) -> StatusLine | None:
        """A started status line, or None when ``quiet`` or ``stream`` is not a terminal."""
        if quiet or not is_terminal(stream):
            return None
        line = cls(collector, stream, interval=interval)
        line.start()
        return line

    def render(self) -> str:
        """The line for the counters as they are now (also updates the events/s estimate)."""
        pipeline = self.collector.pipeline
        intake = pipeline.intake
        now, events = self._clock(), intake.events_in
        if self._last is not None and now > self._last[0]:
            self._rate = (events - self._last[1]) / (now - self._last[0])
        self._last = (now, events)
        losses = dict(getattr(pipeline, "_all_losses", {}))  # reported so far (the pipeline's total)
        losses_pending = dict(intake.losses)  # not yet collected by the pipeline's reporter
        dropped = sum(n for (_, _, unit), n in [*losses.items(), *losses_pending.items()] if unit == "events")
        self._drops = max(self._drops, dropped)  # a collection in flight may hide some for a moment
        batches = 0
        health = []
        for lane in pipeline.lanes:
            stats = lane.snapshot()
            extra = lane.sink.stats()
            batches += extra.get("batches_written", extra.get("batches", 0))
            grew = stats.events_dropped > self._lane_drops.get(lane.stage, 0)
            self._lane_drops[lane.stage] = stats.events_dropped
            mib = stats.queued_bytes >> 20
            sink_state = lane.health.state  # failing or stopped: said first, the queue after
            state = "dropping" if grew else f"queued {mib} MiB" if mib else "ok"
            if sink_state != "ok":
                state = sink_state if state == "ok" else f"{sink_state}, {state}"
            if stats.events_spooled:  # held on the sink's disk: neither delivered nor lost
                state += f", {_count(stats.events_spooled)} spooled"
            health.append(f"{lane.sink.name} {state}")
        errors = getattr(intake, "errors_reported", 0)
        return (
            f"cuptistream: {_count(self._rate)} events/s · {_count(events)} events · "
            f"{_count(batches)} batches · {_count(self._drops)} dropped · {errors} errors · "
            f"{self._memory()}sinks: {', '.join(health) or 'none'}"
        )

    def _memory(self) -> str:
        """The collector's own heap apart from the probes' pools it maps (``collector.memory``)."""
        watch = getattr(self.collector, "memory", None)
        if watch is None or not watch.current.anon_kib:
            return ""
        now = watch.current
        return f"mem {now.anon_kib >> 10} MiB own + {now.shmem_kib >> 10} MiB shared · "

    def draw(self) -> None:
        try:
            line = self.render()
        except (RuntimeError, AttributeError, KeyError):  # a counter changed size mid-read: next time
            return
        width = _columns(self.stream)
        if len(line) > width - 1:
            line = line[: width - 2] + "…"
        self._write(_CLEAR + line)
        self.draws += 1

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: stop drawing, quietly
            self._stop.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cuptistream-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.draw()

    def stop(self) -> None:
        """Stop drawing and erase the line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            if self.draws:
                self._write(_CLEAR)


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80
