"""Trace windows in the collector: the spans each probe reports, and the on-demand requests of
``cuptistream trace`` waiting for theirs.

- ``SpanBook`` (one per probe connection, on its thread) counts the records decoded between a
  window's open and close ``TraceSpan`` and makes the ``TraceWindow`` event of a closed window.
- ``WindowRequests`` (one per collector) follows a request from ``OpenWindow`` to the last close:
  each chosen probe answers (``WindowAnswer``: how many windows it opened, which sources refused)
  and closes that many windows, or hangs up. ``wait`` returns when every probe is settled or the
  deadline passes. The close carries the intake's mark (``Intake.last_seq`` after the window's
  events), so the caller can then wait until every sink has those events (``Pipeline.holding_through``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from cuptistream.channel.messages import TraceSpan, WindowAnswer
from cuptistream.events import TraceWindow


class SpanBook:
    """One connection's open spans: (stream, window) -> the stream's decoded records at the open."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, int], int] = {}

    def opened(self, span: TraceSpan, records: int) -> None:
        self._open[span.stream, span.window] = records

    def closed(self, span: TraceSpan, source: str, records: int) -> TraceWindow:
        """The event for a closed window; ``records`` is the stream's decoded total now. A close
        whose open never arrived (the probe reconnected in between) counts no records."""
        at_open = self._open.pop((span.stream, span.window), records)
        return TraceWindow(
            source=source, window=span.window, start=span.start, end=span.end, kinds=list(span.kinds),
            records=max(0, records - at_open), on_demand=span.on_demand, request=span.request,
            fresh=span.fresh,
        )  # fmt: skip


@dataclass
class ProbeWindows:
    """One probe's part of a request."""

    pid: int
    rank: int | None
    answered: bool = False
    windows: int = 0  # the probe opened this many (its answer)
    opened: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    closed: int = 0
    records: int = 0
    start: int = 0  # CUPTI clock ns: the earliest open, the latest close
    end: int = 0
    mark: int = 0  # the intake's last_seq after its last close's events
    problem: str = ""  # why it will not finish (hung up, could not be asked)

    @property
    def settled(self) -> bool:
        return bool(self.problem) or (self.answered and self.closed >= self.windows)


@dataclass
class Request:
    number: int
    seconds: float
    probes: dict[object, ProbeWindows]  # by connection


class WindowRequests:
    """The on-demand requests in flight, fed by the connections' threads. Thread-safe."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._requests: dict[int, Request] = {}
        self._last = 0

    def begin(self, seconds: float, probes: dict[object, ProbeWindows]) -> Request:
        """A new request for ``probes`` (connection -> its entry); its number goes in ``OpenWindow``."""
        with self._changed:
            self._last += 1
            request = Request(self._last, seconds, probes)
            self._requests[request.number] = request
            return request

    def end(self, request: Request) -> None:
        with self._changed:
            self._requests.pop(request.number, None)

    def _entry(self, connection: object, number: int) -> ProbeWindows | None:
        request = self._requests.get(number)
        return None if request is None else request.probes.get(connection)

    def answered(self, connection: object, answer: WindowAnswer) -> None:
        with self._changed:
            if (entry := self._entry(connection, answer.request)) is not None:
                entry.answered = True
                entry.windows = answer.windows
                entry.opened = list(answer.opened)
                entry.refused = dict(answer.refused)
                self._changed.notify_all()

    def span(self, connection: object, span: TraceSpan, records: int, mark: int) -> None:
        """A span of ``request`` opened or closed (``records`` in the closed window; ``mark``: the
        intake's number after its events)."""
        with self._changed:
            entry = self._entry(connection, span.request) if span.on_demand else None
            if entry is None:
                return
            entry.start = min(entry.start or span.start, span.start)
            if span.end:
                entry.closed += 1
                entry.records += records
                entry.end = max(entry.end, span.end)
                entry.mark = max(entry.mark, mark)
            self._changed.notify_all()

    def failed(self, connection: object, problem: str) -> None:
        """The probe behind ``connection`` will not finish any request (it hung up)."""
        with self._changed:
            for request in self._requests.values():
                entry = request.probes.get(connection)
                if entry is not None and not entry.settled:
                    entry.problem = problem
            self._changed.notify_all()

    def wait_answers(self, request: Request, deadline: float) -> bool:
        """Wait until every probe of ``request`` answered (or failed), or ``deadline``."""
        with self._changed:
            return self._changed.wait_for(
                lambda: all(p.answered or p.problem for p in request.probes.values()),
                max(0.0, deadline - time.monotonic()),
            )

    def wait(self, request: Request, deadline: float) -> bool:
        """Wait until every probe of ``request`` is settled or ``deadline`` (``time.monotonic()``)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: all(p.settled for p in request.probes.values()), max(0.0, deadline - time.monotonic())
            )
