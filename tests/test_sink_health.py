"""A sink's health (cuptistream/delivery/health.py): each change of state is said once, as an Error event
and one stderr line, while the fault lasts and again when it passes; the state is in the status line
and the shutdown report. A real pipeline with an in-memory sink that fails for a while, through the
shared retry loop, as a sink on a full disk or behind a 503 does."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import trio

import cuptistream
from cuptistream.config import QueueConfig, RetryConfig
from cuptistream.delivery.health import SinkHealth
from cuptistream.delivery.retry import RetriesExhausted, RetryableError, call_with_retry
from cuptistream.errors import PermanentSinkError
from cuptistream.events import Error
from cuptistream.plugin import OutgoingBatch
from tests.pipeline_helpers import MemorySink
from tests.stalling_servers import closed_port
from tests.test_pipeline import _kernels


def test_each_change_is_said_once() -> None:
    said: list[tuple[str, str]] = []
    health = SinkHealth("sinks[x]", lambda severity, message: said.append((severity, message)))
    health.ok()  # not failing: nothing to say
    for attempt in range(5):
        health.failing(f"HTTP 503 (attempt {attempt})")
    assert health.state == "failing" and health.problem == "HTTP 503 (attempt 4)"  # the latest cause
    health.ok()
    health.ok()
    health.failing("disk\nfull")  # one line, whatever the cause's text holds
    health.stopped("HTTP 401: check the credentials")
    health.ok()  # stopped is final
    health.failing("again")
    assert [s for s, _ in said] == ["error", "info", "error", "error"]
    assert said[0][1] == "sinks[x]: failing: HTTP 503 (attempt 0); retrying"
    assert said[1][1].startswith("sinks[x]: recovered after ") and said[1][1].endswith(
        "(was: HTTP 503 (attempt 4))"
    )
    assert said[2][1] == "sinks[x]: failing: disk full; retrying"
    assert said[3][1] == "sinks[x]: stopped: HTTP 401: check the credentials"
    report = health.report()
    assert (report.state, report.faults, report.problem) == ("stopped", 2, "HTTP 401: check the credentials")


class FlakySink(MemorySink):
    """Fails every attempt with a retryable error until ``healthy_at`` (monotonic), through the
    shared retry loop with a short backoff; ``stop_with`` makes a write raise PermanentSinkError."""

    def __init__(self, name: str, healthy_at: float, stop_with: str = "") -> None:
        super().__init__(name, queue=QueueConfig(max_bytes=64 << 20, full_policy="block"))
        self.healthy_at = healthy_at
        self.stop_with = stop_with
        self.attempts = 0

    async def write(self, batch: OutgoingBatch) -> None:
        if self.stop_with:
            raise PermanentSinkError(f"{self.where()}: HTTP 401: check the credentials", self.stop_with)

        async def attempt(_timeout: float) -> None:
            self.attempts += 1
            if time.monotonic() < self.healthy_at:
                raise RetryableError("No space left on device")
            await MemorySink.write(self, batch)

        retry = RetryConfig(initial_backoff=0.02, max_backoff=0.05, max_elapsed=30)
        try:
            await call_with_retry(attempt, retry, 5.0, trio.current_time() + 30)
        except RetriesExhausted:  # pragma: no cover - 30 s is never reached here
            raise


def _run(sink: MemorySink, seconds: float, capsys: Any) -> tuple[cuptistream.Session, list[str]]:
    config = {
        "pipeline": {"batch": {"max_events": 100, "max_latency": "20ms"}, "stats_interval": "1h"},
        "sinks": [{"type": "null"}],
    }
    with cuptistream.session(config, sinks=[sink], quiet=True) as session:
        end = time.monotonic() + seconds
        start = 0
        while time.monotonic() < end:
            session.emitter.emit(_kernels(start, 50))
            start += 50
            time.sleep(0.01)
    lines = [line for line in capsys.readouterr().err.splitlines() if f"sinks[{sink.name}]" in line]
    return session, lines


def test_a_sink_failing_for_a_while_is_said_once_then_recovered(capsys: Any) -> None:
    sink = FlakySink("flaky", healthy_at=time.monotonic() + 0.6)
    session, lines = _run(sink, 1.2, capsys)
    assert sink.attempts > 5  # retried many times ...
    assert lines[0] == "cuptistream: sinks[flaky]: failing: No space left on device; retrying"
    assert lines[1].startswith("cuptistream: sinks[flaky]: recovered after ")
    assert len(lines) == 2, lines  # ... said once each way
    errors = [e for b in sink.batches for e in b.events if isinstance(e, Error) and e.origin == "sink:flaky"]
    assert [(e.severity, e.message) for e in errors] == [
        ("error", "sinks[flaky]: failing: No space left on device; retrying"),
        ("info", lines[1].removeprefix("cuptistream: ")),
    ]
    report = session.report
    assert report is not None
    assert report.health["flaky"].state == "ok" and report.health["flaky"].faults == 1
    lane = report.sinks["flaky"]
    assert lane.events_dropped == 0 and lane.events_out == lane.events_in  # retried, nothing lost


def test_a_recovery_while_the_pipeline_drains_reaches_the_other_sinks(capsys: Any) -> None:
    """The sink fails until after the program ended (a disk full until the end of the run), so it
    recovers while the lanes drain, after the distributor stopped: its ``recovered`` event still
    reaches the other sink, with the final accounting, rather than staying in an intake nobody reads
    any more (tests/test_fault_reconciliation.py's disk-full run depends on it)."""
    config = {"pipeline": {"batch": {"max_events": 100, "max_latency": "20ms"}}, "sinks": [{"type": "null"}]}
    other = MemorySink("other", queue=QueueConfig(max_bytes=64 << 20, full_policy="block"))
    flaky = FlakySink("late", healthy_at=math.inf)
    with cuptistream.session(config, sinks=[flaky, other], quiet=True) as session:
        for start in range(0, 500, 100):
            session.emitter.emit(_kernels(start, 100))
        time.sleep(0.3)  # failing by now
        # Recovers while the session stops, after the distributor returned (about 0.7 s after this
        # block on a 2-core machine; a ``recovered`` event emitted then must still leave the intake).
        flaky.healthy_at = time.monotonic() + 2.0
    lines = [line for line in capsys.readouterr().err.splitlines() if "sinks[late]" in line]
    assert len(lines) == 2 and "recovered after" in lines[1], lines
    said = [(e.severity, e.message) for b in other.batches for e in b.events if isinstance(e, Error)]
    assert ("info", lines[1].removeprefix("cuptistream: ")) in said, said
    report = session.report
    assert report is not None and report.health["late"].state == "ok"
    assert report.sinks["late"].events_out == report.sinks["late"].events_in


def test_a_permanent_error_stops_the_sink_and_counts_everything_under_its_reason(capsys: Any) -> None:
    sink = FlakySink("refused", healthy_at=0, stop_with="unauthorized")
    other = MemorySink("other", queue=QueueConfig(max_bytes=64 << 20, full_policy="block"))
    config = {"pipeline": {"batch": {"max_events": 100, "max_latency": "20ms"}}, "sinks": [{"type": "null"}]}
    with cuptistream.session(config, sinks=[sink, other], quiet=True) as session:
        for start in range(0, 2_000, 100):
            session.emitter.emit(_kernels(start, 100))
    lines = [line for line in capsys.readouterr().err.splitlines() if "sinks[refused]" in line]
    assert lines == [
        "cuptistream: sinks[refused]: stopped: HTTP 401: check the credentials "
        "(its data is counted lost as unauthorized)"
    ]
    report = session.report
    assert report is not None and report.health["refused"].state == "stopped"
    lane = report.sinks["refused"]
    assert lane.events_out == 0 and lane.events_dropped == lane.events_in > 2_000  # + control events
    assert report.losses["sink:refused/unauthorized"] == lane.events_in
    assert len(other.kernels()) == 2_000  # the other sink and the program go on
    assert f"refused: 0 delivered, {lane.events_dropped} dropped (stopped: HTTP 401" in report.summary()


@pytest.mark.parametrize("state", ["failing", "stopped"])
def test_the_status_line_shows_the_state(state: str) -> None:
    from cuptistream.collector.collector import Collector
    from cuptistream.collector.status import StatusLine

    # A sink that cannot deliver (nothing listens on its port): only a delivered batch marks a sink
    # ok, so the state set below holds while the line is drawn. (A null sink would deliver the Error
    # event that saying "failing" emits, and recover before the line is drawn.)
    sink = {"type": "otlp", "name": "n", "endpoint": f"http://127.0.0.1:{closed_port()}"}
    cfg = cuptistream.load_config({"sources": [], "sinks": [sink], "pipeline": {"shutdown_deadline": "1s"}})
    collector = Collector(cfg).start()
    try:
        getattr(collector.pipeline.lanes[0].health, state)("HTTP 503")
        line = StatusLine(collector, stream=None).render()  # type: ignore[arg-type]
        assert f"sinks: n {state}" in line
    finally:
        collector.finish(probe_timeout=0)
