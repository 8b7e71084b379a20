"""A metrics window (``trace --metrics``) and PM sampling in one process: the window borrows the
device's counters, PM sampling stops and disables for its length and then samples again, and the
samples it missed are a loss. No GPU here: PM sampling's device side and the range profiler are the
stand-ins of tests/test_pm_sampling_source.py and tests/test_kernel_profile.py, which answer as
CUPTI does; the loan, the source's worker and the profile are the real ones."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from cuptistream.cupti import counter_loans, driver
from cuptistream.cupti.pm_metrics import default_metrics
from cuptistream.events import KernelMetrics
from cuptistream.sources.activity.kernel_profile import KernelProfile
from tests.test_coexist import wait_for
from tests.test_kernel_profile import StandInSide, _ranges
from tests.test_pm_sampling_source import StandInSession, _source
from tests.test_sass_window import RecordingEmitter


@pytest.fixture(autouse=True)
def _no_driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    clock = iter(range(1_000, 10**9, 1_000))
    monkeypatch.setattr(driver, "timestamp", lambda: next(clock))  # no CUPTI clock here
    driver.acquire("test")  # so the source's release does not finalize a CUPTI that has no driver here
    yield
    driver.release("test", finalize=False)


class ProfilingSide(StandInSide):
    """The range profiler's stand-in, which also notes what PM sampling had done when it began."""

    def __init__(self, pm: StandInSession) -> None:
        super().__init__({0: _ranges(["gemm"], [[1.0]])})
        self.pm = pm
        self.pm_calls_at_chip: list[str] = []

    def chip(self, device: int) -> str:
        self.pm_calls_at_chip = list(self.pm.calls)
        return super().chip(device)


def test_a_metrics_window_borrows_the_counters_and_pm_sampling_resumes_after() -> None:
    pm = StandInSession(0)
    pm.refused = {default_metrics("GH100").metrics[-1]}  # left out with one info line, not one a loan
    source, pm_events = _source(pm)  # a sample every 10 ms, decoded every 50 ms
    source.start()
    try:
        assert wait_for(lambda: pm.decodes >= 2, 5.0)
        side, window = ProfilingSide(pm), RecordingEmitter()
        profile = KernelProfile.open("gpu__time_duration.sum", window, "source:activity", side)
        assert side.pm_calls_at_chip[-2:] == ["stop", "disable"], "the profiler began beside PM sampling"
        decodes = pm.decodes
        profile.start()
        time.sleep(0.3)
        assert pm.decodes == decodes and pm.calls[-1] == "disable", "PM sampling went on in the window"
        profile.finish()
        assert wait_for(lambda: pm.decodes >= decodes + 2, 5.0)
    finally:
        source.stop()
    assert [e for e in window.events if isinstance(e, KernelMetrics)] and window.errors == []
    assert pm.calls.count("enable") == 2 and pm.calls.count("start") == 2  # taken up again after
    [(stage, reason, missed, unit)] = pm_events.losses
    assert (stage, reason, unit) == ("pm_sampling", "counters_lent", "samples")
    assert 25 <= missed <= 100, missed  # 0.3 s and more at 10 ms
    assert [severity for _, _, severity, _ in pm_events.errors] == ["info"]


def test_stopping_while_the_counters_are_lent_returns_at_once() -> None:
    pm = StandInSession(0)
    source, pm_events = _source(pm)
    source.start()
    assert wait_for(lambda: pm.decodes >= 1, 5.0)
    loan = counter_loans.borrow([0], timeout=2.0)
    assert loan.refused == []
    time.sleep(0.1)
    began = time.monotonic()
    source.stop()
    assert time.monotonic() - began < 1.0
    loan.give_back()
    assert pm.calls.count("enable") == 1 and pm.calls[-1] == "disable"
    assert [reason for _, reason, _, _ in pm_events.losses] == ["counters_lent"]
    assert counter_loans.borrow([0], timeout=0.1).refused == [], "the stopped source still lends"


class Stuck:
    """A holder that does not let go in time (its CUPTI call hangs)."""

    def __init__(self) -> None:
        self.taken_back = 0

    def lend(self, timeout: float) -> bool:
        return False

    def take_back(self) -> None:
        self.taken_back += 1


def test_a_holder_that_does_not_let_go_is_one_warning_and_is_given_back_its_loan() -> None:
    stuck = Stuck()
    counter_loans.register(0, stuck)
    try:
        window = RecordingEmitter()
        profile = KernelProfile.open(
            "gpu__time_duration.sum", window, "source:activity", StandInSide({0: _ranges([], [[]])})
        )
        ((_, message, severity, _),) = window.errors
        assert severity == "warning" and "PM sampling of device 0 did not let go of the counters" in message
        profile.cancel()
        profile.cancel()
        assert stuck.taken_back == 1
    finally:
        counter_loans.unregister(0, stuck)
