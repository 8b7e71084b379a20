"""A sink's health, kept by its lane, so every sink reports faults the same way without code of its own.

A sink is in one of three states:

- ``ok``: delivering (or nothing to deliver);
- ``failing``: a fault that may pass (disk full, connection refused, HTTP 503, a broker away, a sink
  not up within ``connect_timeout``); the sink keeps retrying with the shared backoff;
- ``stopped``: a fault that will not pass (credentials refused); nothing more is sent, and what the
  sink would have sent is counted lost.

Each change of state, not each retry, is said once: an ``Error`` event (origin ``sink:<name>``,
severity ``error`` on failing or stopping, ``info`` on recovering) and one line on stderr. The state,
its problem and how many faults there were are in the live status line and in the shutdown report
(``ShutdownReport.health``).

Who changes it:

- the lane: a ``write`` that raises marks the sink failing, one that returns marks it ok, and
  ``SinkStopped`` stops it (``SinkLane.stop``);
- the shared retry loop (``cuptistream.delivery.retry.call_with_retry``): the first retryable failure inside a
  ``write`` marks the sink failing at once, so a fault is visible while the write is still retrying;
- code outside ``write`` (a background connect, a delivery thread): ``lane.health.failing(problem)``
  and ``lane.health.ok()``. All methods are thread-safe and never raise.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from collections.abc import Callable
from typing import Literal

import msgspec

State = Literal["ok", "failing", "stopped"]

# The health of the sink whose ``write`` runs in this trio task (set by its lane), for the retry loop.
_current: contextvars.ContextVar[SinkHealth | None] = contextvars.ContextVar(
    "cuptistream_sink_health", default=None
)


class HealthReport(msgspec.Struct, kw_only=True):
    """A sink's health as the shutdown report (``--report-json``) gives it."""

    state: State
    problem: str = ""  # the current problem, or the last one after a recovery ("" if none)
    faults: int = 0  # times the sink went from ok to failing or stopped
    since: float = 0.0  # Unix time of the last change of state (0: never changed)


class SinkHealth:
    """One sink's state. ``say(severity, message)`` is called once per change of state (the lane
    turns it into an ``Error`` event); the same message goes to stderr, one line."""

    def __init__(self, where: str, say: Callable[[str, str], None]) -> None:
        self.where = where  # "sinks[<name>]": how every line about this sink starts
        self._say = say
        self._lock = threading.Lock()
        self.state: State = "ok"
        self.problem = ""
        self.faults = 0
        self._since = 0.0
        self._failed_at = 0.0  # monotonic time the current fault began

    def failing(self, problem: str) -> None:
        """A fault that may pass; said once until the sink recovers. Ignored once stopped."""
        self._change("failing", problem, f"{self.where}: failing: {problem}; retrying")

    def stopped(self, problem: str) -> None:
        """A fault that will not pass: ``problem`` names the fix. Said once; final."""
        self._change("stopped", problem, f"{self.where}: stopped: {problem}")

    def ok(self) -> None:
        """Delivering again (or up at last): said once if the sink was failing. Ignored once stopped."""
        with self._lock:
            if self.state != "failing":
                return
            seconds = time.monotonic() - self._failed_at
            message = f"{self.where}: recovered after {seconds:.1f}s (was: {self.problem})"
            self._set("ok")
        self._announce("info", message)

    def report(self) -> HealthReport:
        with self._lock:
            return HealthReport(state=self.state, problem=self.problem, faults=self.faults, since=self._since)

    def _change(self, state: State, problem: str, message: str) -> None:
        problem = " ".join(problem.split())  # one line, whatever the cause's text holds
        with self._lock:
            if self.state == "stopped" or self.state == state:
                if self.state == state == "failing":
                    self.problem = problem  # the latest cause, without a new line
                return
            if self.state == "ok":
                self.faults += 1
                self._failed_at = time.monotonic()
            self.problem = problem
            self._set(state)
        self._announce("error", " ".join(message.split()))

    def _set(self, state: State) -> None:
        self.state = state
        self._since = time.time()

    def _announce(self, severity: str, message: str) -> None:
        try:
            self._say(severity, message)
        except Exception:  # the accounting must go on; the stderr line still tells
            pass
        say_on_stderr(message)


def say_on_stderr(message: str) -> None:
    """One ``cuptistream: ...`` line on stderr, starting at column 0 even over the live status line."""
    try:
        prefix = "\r\x1b[K" if sys.stderr.isatty() else ""
        sys.stderr.write(f"{prefix}cuptistream: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # no stderr, or closed: nothing to tell it on
        pass


def bind(health: SinkHealth) -> None:
    """Make ``health`` the current sink's for this task (and the threads it starts with trio)."""
    _current.set(health)


def retrying(reason: str) -> None:
    """An attempt inside the current sink's ``write`` failed and will be retried: the sink is failing
    (said once). Outside a lane (a sink used on its own, a test), nothing happens."""
    health = _current.get()
    if health is not None:
        health.failing(reason)
