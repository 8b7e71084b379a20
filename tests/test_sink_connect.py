"""Sinks come up in the background (``cuptistream/pipeline/connect.py``) and blocking calls without a
deadline are abandoned at ours (``cuptistream/delivery/abandonable.py``).

The sinks here are real ``Sink`` subclasses whose ``connect`` fails as a destination would (the
network is the Kafka fault matrix's job: ``tests/test_fault_matrix_kafka.py``); a full pipeline runs
them through ``cuptistream.session``.
"""

from __future__ import annotations

import threading
import time

import pytest
import trio

import cuptistream
from cuptistream.config import Duration, QueueConfig, RetryConfig, SinkConfig
from cuptistream.delivery.abandonable import call_by
from cuptistream.errors import PermanentSinkError, SinkUnavailableError
from cuptistream.events import Kernel
from cuptistream.pipeline.connect import require_healthy
from tests.pipeline_helpers import MemorySink


class ComesUpLate(MemorySink):
    """Unreachable (a transient error) until ``up_at`` (``time.monotonic()``)."""

    def __init__(self, name: str, up_at: float, connect_timeout: float = 0.3) -> None:
        super().__init__(name, queue=QueueConfig())
        self.config = SinkConfig(
            type="memory", name=name, connect_timeout=Duration(connect_timeout),
            retry=RetryConfig(initial_backoff=Duration(0.05), max_backoff=Duration(0.1)),
        )  # fmt: skip
        self.up_at = up_at
        self.attempts = 0

    async def connect(self) -> None:
        self.attempts += 1
        if time.monotonic() < self.up_at:
            raise SinkUnavailableError(f"{self.where()}: connection refused; check the address")


class Refuses(ComesUpLate):
    async def connect(self) -> None:
        self.attempts += 1
        raise PermanentSinkError(f"{self.where()}: login refused; check the password", "login_refused")


class Hangs(ComesUpLate):
    async def connect(self) -> None:
        self.attempts += 1
        await trio.sleep_forever()


def _kernels(count: int) -> list[Kernel]:
    return [Kernel(start=i, end=i + 1, name="k", device_id=0, context_id=1, stream_id=1, correlation_id=i)
            for i in range(count)]  # fmt: skip


CONFIG = {
    "pipeline": {"batch": {"max_events": 100, "max_latency": "20ms"}, "shutdown_deadline": "2s"},
    "sinks": [{"type": "null"}],
}


def test_a_late_sink_queues_says_so_once_and_delivers_everything(capfd: pytest.CaptureFixture[str]) -> None:
    sink = ComesUpLate("late", up_at=time.monotonic() + 0.8)
    with cuptistream.session(CONFIG, sinks=[sink], quiet=True) as session:
        session.emitter.emit(_kernels(500))  # before the sink is up: queued in its lane
        time.sleep(1.2)
        session.emitter.emit(_kernels(500))
    report = session.report
    assert report is not None
    err = capfd.readouterr().err.splitlines()
    failing = [line for line in err if "sinks[late]: failing: not up after connect_timeout (0.3s)" in line]
    assert len(failing) == 1 and "connection refused; check the address" in failing[0], err
    assert len([line for line in err if "sinks[late]: recovered" in line]) == 1, err
    assert sink.attempts > 2 and len(sink.kernels()) == 1000
    assert report.sinks["late"].events_dropped == 0


def test_a_refused_sink_stops_and_counts_what_it_would_have_sent(capfd: pytest.CaptureFixture[str]) -> None:
    refused, other = Refuses("refused", up_at=0.0), MemorySink("other")
    with cuptistream.session(CONFIG, sinks=[refused, other], quiet=True) as session:
        session.emitter.emit(_kernels(300))
        time.sleep(0.3)
        session.emitter.emit(_kernels(300))
    report = session.report
    assert report is not None
    stats = report.sinks["refused"]
    assert refused.attempts == 1 and refused.batches == []
    assert stats.events_out == 0 and stats.events_in == stats.events_dropped >= 600
    assert report.losses["sink:refused/login_refused"] == stats.events_dropped
    assert len(other.kernels()) == 600  # the other sink goes on
    stopped = [line for line in capfd.readouterr().err.splitlines() if "sinks[refused]: stopped:" in line]
    assert len(stopped) == 1 and "login refused; check the password" in stopped[0]


@pytest.mark.parametrize(
    ("sink", "needle"),
    [
        (Hangs("hangs", up_at=0.0), "sinks[hangs]: no answer (not up within 0.3s, --require-healthy)"),
        (ComesUpLate("down", up_at=float("inf")), "sinks[down]: connection refused; check the address"),
        (Refuses("refused", up_at=0.0), "sinks[refused]: login refused; check the password"),
    ],
    ids=["hangs", "down", "refused"],
)
def test_require_healthy_gives_up_at_connect_timeout(sink: ComesUpLate, needle: str) -> None:
    started = time.monotonic()
    with pytest.raises(SinkUnavailableError) as caught:
        trio.run(require_healthy, [MemorySink("fine"), sink])
    assert time.monotonic() - started < 0.3 + 0.2
    assert str(caught.value).startswith(needle) and "\n" not in str(caught.value)


def test_call_by_returns_raises_or_abandons() -> None:
    assert call_by(lambda: 42, time.monotonic() + 1, name="t") == 42
    with pytest.raises(KeyError):
        call_by(lambda: {}["x"], time.monotonic() + 1, name="t")
    release, late = threading.Event(), []

    def stuck() -> str:
        release.wait(5)
        return "made late"

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        call_by(stuck, time.monotonic() + 0.2, name="cuptistream-test-stuck", late=late.append)
    assert time.monotonic() - started < 0.5
    release.set()
    deadline = time.monotonic() + 5
    while not late and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late == ["made late"]  # handed over to be closed, since nobody waited for it


class HoldsWhileDown(ComesUpLate):
    """Takes batches while it is not up (as the Kafka sink holds or spools them)."""

    writes_while_connecting = True


def test_writes_while_down_do_not_say_the_sink_recovered(capfd: pytest.CaptureFixture[str]) -> None:
    sink = HoldsWhileDown("holds", up_at=float("inf"))
    with cuptistream.session(CONFIG, sinks=[sink], quiet=True) as session:
        for _ in range(10):  # writes keep returning after the "not up" line
            session.emitter.emit(_kernels(100))
            time.sleep(0.1)
    err = capfd.readouterr().err.splitlines()
    assert len([line for line in err if "sinks[holds]: failing: not up after" in line]) == 1, err
    assert not [line for line in err if "recovered" in line], err
    assert len(sink.kernels()) == 1000  # held by the sink itself, so delivered as far as the lane knows
