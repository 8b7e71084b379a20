"""The overhead governor on the CPU: a fake cost signal drives it, and the duty cycle it
chooses must hold the budget. The cost signal is fake because the real one (CUPTI control calls and
patched kernels) needs a GPU; tests/gpu and bench/sampling_overhead.py measure that one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from cuptistream.config import load
from cuptistream.errors import ConfigError
from cuptistream.events import GovernorDecision
from cuptistream.overhead import HEADROOM, Governor, Plan, Throttle, WindowCost


def governor(budget: float | None) -> tuple[Governor, list[GovernorDecision]]:
    decisions: list[GovernorDecision] = []
    return Governor(budget, decisions.append), decisions


def throttle(gov: Governor, name: str = "pc_sampling", window: float = 1.0, prior: float = 0.25) -> Throttle:
    return Throttle(
        gov,
        name, window_s=window, pause_s=19.0, min_window_s=0.05, max_pause_s=600.0,
        prior_unit_cost=prior, timestamp=lambda: 123,
    )  # fmt: skip


def run(t: Throttle, windows: int, cost_of: object) -> list[tuple[Plan, WindowCost]]:
    """Open ``windows`` windows as planned; ``cost_of(open_s)`` is what each costs the program."""
    history = []
    plan = t.first()
    for _ in range(windows):
        cost = cost_of(plan.window_s)  # type: ignore[operator]
        history.append((plan, cost))
        plan = t.window_done(cost)
    return history


def spent_fraction(history: list[tuple[Plan, WindowCost]]) -> float:
    """The program's time the windows cost, over the time they and their pauses took."""
    return sum(c.total_s for _, c in history) / sum(p.window_s + p.pause_s for p, _ in history)


def proportional(unit: float) -> object:
    return lambda open_s: WindowCost(open_s=open_s, host_s=0.4 * unit * open_s, gpu_s=0.6 * unit * open_s)


def test_the_duty_cycle_is_the_budget_over_the_measured_cost() -> None:
    gov, _ = governor(0.01)
    t = throttle(gov)
    history = run(t, 30, proportional(0.2))
    plan = history[-1][0]
    assert plan.window_s == 1.0
    assert plan.duty == pytest.approx(HEADROOM * 0.01 / 0.2, rel=0.02)  # 1 s on, about 21 s off
    assert spent_fraction(history[10:]) <= HEADROOM * 0.01 * 1.02


def test_two_sources_split_the_budget() -> None:
    gov, _ = governor(0.01)
    pcs, sass = throttle(gov, "pc_sampling"), throttle(gov, "sass", window=0.1, prior=1.5)
    pc_history = run(pcs, 30, proportional(0.2))
    sass_history = run(sass, 30, proportional(1.5))
    assert gov.share() == pytest.approx(0.005)
    assert pc_history[-1][0].duty == pytest.approx(HEADROOM * 0.005 / 0.2, rel=0.02)
    assert sass_history[-1][0].duty == pytest.approx(HEADROOM * 0.005 / 1.5, rel=0.02)
    assert spent_fraction(pc_history[10:]) + spent_fraction(sass_history[10:]) <= 0.01 * 1.02


def test_a_costlier_phase_is_met_at_once_and_a_cheaper_one_earns_samples_back_slowly() -> None:
    gov, _ = governor(0.01)
    t = throttle(gov, prior=0.2)
    run(t, 20, proportional(0.2))
    calm_pause = t.plan.pause_s
    t.window_done(proportional(1.0)(1.0))  # type: ignore[operator]
    # One expensive window: the pause grows by most of the way to the new cost's (99 s) at once.
    assert t.plan.pause_s > calm_pause + 0.6 * (99 - calm_pause)
    t.window_done(proportional(0.2)(1.0))  # type: ignore[operator]
    assert t.plan.pause_s > calm_pause * 2  # one cheap window does not undo it


def test_fixed_costs_per_window_are_held_too() -> None:
    """Start/Stop costs the same whatever the window's length: the pause still holds the budget."""
    gov, _ = governor(0.005)
    t = throttle(gov, window=0.25)
    history = run(t, 40, lambda open_s: WindowCost(open_s=open_s, host_s=0.02, gpu_s=0.05 * open_s))
    assert spent_fraction(history[15:]) <= 0.005 * 1.02


def test_when_the_longest_pause_overspends_windows_get_shorter() -> None:
    gov, _ = governor(0.001)
    t = throttle(gov, window=1.0)
    history = run(t, 30, proportional(2.0))  # 2 s of cost per open second: needs 1 s on / 2000 s off
    plan = history[-1][0]
    assert plan.pause_s == pytest.approx(600.0)
    assert 0.05 <= plan.window_s < 0.5
    assert spent_fraction(history[10:]) <= 0.001 * 1.02


def test_past_the_shortest_window_pauses_grow_beyond_the_longest_so_the_budget_holds() -> None:
    gov, _ = governor(0.001)
    t = throttle(gov, window=1.0)
    # 15 s per window whatever its length (a SASS window that patches every kernel).
    history = run(t, 20, lambda open_s: WindowCost(open_s=open_s, host_s=15.0, gpu_s=0.0))
    plan = history[-1][0]
    assert plan.window_s == pytest.approx(0.05)
    assert plan.pause_s > 600.0
    assert spent_fraction(history[10:]) <= 0.001 * 1.02


def per_window(gov: Governor, prior: float = 15.0) -> Throttle:
    """Like the SASS source: a 0.25 s window charged per window."""
    return Throttle(
        gov, "sass", window_s=0.25, pause_s=59.75, prior_unit_cost=prior, per_window=True,
        timestamp=lambda: 123,
    )  # fmt: skip


def fixed(seconds: float) -> object:
    """A window that costs ``seconds`` whatever its length, most of it after it closed (FlushData)."""
    return lambda open_s: WindowCost(open_s=open_s, host_s=seconds - open_s, gpu_s=open_s)


def test_a_source_charged_per_window_holds_its_share_from_the_first_window() -> None:
    gov, _ = governor(0.01)
    throttle(gov, "pc_sampling")
    t = per_window(gov, prior=15.0)
    history = run(t, 12, fixed(8.6))  # the median SASS window on the H100 transformer
    assert all(p.window_s == 0.25 for p, _ in history)  # the length buys data, not cost
    assert history[0][0].pause_s == pytest.approx(15.0 / (HEADROOM * 0.005) - 0.25)  # the prior: 56 min
    assert spent_fraction(history) <= HEADROOM * 0.005  # every window, the first included
    # The cheaper measured cost earns windows back slowly, towards 8.6 s / 0.5%.
    assert history[-1][0].window_s + history[-1][0].pause_s == pytest.approx(
        8.6 / (HEADROOM * 0.005), rel=0.1
    )


def test_a_window_costlier_than_the_prior_lengthens_the_next_pause_at_once() -> None:
    gov, _ = governor(0.01)
    t = per_window(gov, prior=15.0)
    t.first()
    plan = t.window_done(fixed(25.0)(0.25))  # type: ignore[operator]
    assert plan.window_s + plan.pause_s >= (15.0 + 0.7 * 10.0) / 0.01
    # Over the two cycles, the overspend of the first is mostly made up by the second.
    spent = (25.0 + 25.0) / (15.0 / 0.01 + plan.window_s + plan.pause_s)
    assert spent < 0.01 * 1.4


def test_windows_charged_per_window_get_more_frequent_with_the_budget() -> None:
    per_hour = []
    for budget in (0.005, 0.01, 0.05):
        gov, _ = governor(budget)
        history = run(per_window(gov), 20, fixed(8.6))
        per_hour.append(3600 / (history[-1][0].window_s + history[-1][0].pause_s))
        assert spent_fraction(history) <= budget
    assert per_hour[0] < per_hour[1] < per_hour[2]


def test_a_decision_says_its_cost_is_per_window() -> None:
    gov, decisions = governor(0.01)
    t = per_window(gov)
    run(t, 3, fixed(30.0))
    last = decisions[-1]
    assert last.per_window and last.windows >= 1 and last.measured_host_s == pytest.approx(29.75)
    assert last.expected_cost == pytest.approx(last.unit_cost / (last.window_s + last.pause_s))
    assert last.expected_cost <= 0.01


def test_windows_never_take_more_than_half_the_time() -> None:
    gov, _ = governor(0.5)
    t = throttle(gov)
    run(t, 10, proportional(0.001))
    assert t.plan.duty == pytest.approx(0.5)


def test_samples_per_minute_rise_with_the_budget() -> None:
    open_per_minute = []
    for budget in (0.005, 0.01, 0.05):
        gov, _ = governor(budget)
        history = run(throttle(gov), 30, proportional(0.3))[10:]
        open_per_minute.append(
            60 * sum(p.window_s for p, _ in history) / sum(p.window_s + p.pause_s for p, _ in history)
        )
    assert open_per_minute[0] < open_per_minute[1] < open_per_minute[2]
    assert open_per_minute[2] / open_per_minute[0] == pytest.approx(10, rel=0.05)


def test_without_a_budget_the_configured_cycle_holds() -> None:
    gov, decisions = governor(None)
    t = throttle(gov)
    run(t, 5, proportional(5.0))
    assert t.plan == Plan(1.0, 19.0)
    assert len(decisions) == 1 and decisions[0].budget == 0.0


def test_decisions_are_events_with_the_measurements_behind_them() -> None:
    gov, decisions = governor(0.01)
    t = throttle(gov, prior=0.25)
    run(t, 12, proportional(0.5))
    first, *later = decisions
    assert first.reason.startswith("first plan") and first.windows == 0
    assert first.pause_s == pytest.approx(0.25 / (HEADROOM * 0.01) - 1)  # the prior: 0.25 s per open s, 1%
    assert later, "the measured cost (0.5) moved the plan, which must be announced"
    last = later[-1]
    assert last.source == "pc_sampling" and last.budget == 0.01 and last.share == 0.01
    assert last.measured_open_s == 1.0
    assert last.measured_host_s == pytest.approx(0.2) and last.estimated_gpu_s == pytest.approx(0.3)
    assert last.expected_cost <= 0.01 * 1.05
    # A steady plan is not announced again and again.
    count = len(decisions)
    run(t, 10, proportional(0.5))
    assert len(decisions) <= count + 1


def test_decision_events_round_trip_through_the_codec() -> None:
    from cuptistream.recording.codec import array_header, decode_events, encode_chunk

    gov, decisions = governor(0.01)
    run(throttle(gov), 3, proportional(0.5))
    chunk = encode_chunk(decisions)
    assert decode_events(array_header(chunk.count) + chunk.payload) == decisions


@pytest.mark.parametrize(
    ("text", "fraction"), [("1%", 0.01), ("0.5%", 0.005), ("5%", 0.05), ("off", None), ("false", None)]
)
def test_the_budget_in_the_config(text: str, fraction: float | None) -> None:
    config = load({"overhead": {"budget": yaml.safe_load(text)}, "sinks": [{"type": "null"}]})
    assert config.overhead.fraction == fraction


def test_the_default_budget_is_one_percent() -> None:
    assert load({"sinks": [{"type": "null"}]}).overhead.fraction == 0.01


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("1", "expected a percentage like 1% or 0.5%"),
        ("0.5", "expected a percentage like 1% or 0.5%"),
        ("true", "expected a percentage"),
        ("0%", "between 0.01% and 50%, or off"),
        ("80%", "between 0.01% and 50%, or off"),
        ("nan%", "expected a percentage"),
    ],
)
def test_a_budget_that_cannot_work_is_refused_in_one_line(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as error:
        load({"overhead": {"budget": yaml.safe_load(text)}, "sinks": [{"type": "null"}]})
    message = str(error.value)
    assert message.startswith("overhead") and says in message and "\n" not in message


def test_the_governor_lists_its_throttles_with_their_measured_windows() -> None:
    gov = Governor(0.01, lambda decision: None)
    pcs, sass = throttle(gov, "pc_sampling"), throttle(gov, "sass", window=0.1, prior=1.5)
    pcs.window_done(WindowCost(open_s=1.0, host_s=0.01, gpu_s=0.0))
    assert gov.throttles == (pcs, sass)
    assert [t.source for t in gov.throttles] == ["pc_sampling", "sass"]
    assert [cost.open_s for _, cost in gov.throttles[0].history] == [1.0]


def test_a_source_that_fails_to_start_leaves_the_budget_to_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real session, real file sink; two governed sources stand in for pc_sampling and sass (no GPU
    here): the second makes its throttle, then fails in start() as a SASS source can after it."""
    import cuptistream
    from cuptistream.config import Config, SourceConfig
    from cuptistream.plugin import Source

    class GovernedSource(Source):
        traces_cuda = False
        fail = False

        def use_governor(self, governor: Governor) -> None:
            self.governor = governor

        def start(self) -> None:
            self.throttle = throttle(self.governor, self.name)
            if self.fail:
                raise RuntimeError("no SASS on this GPU")

        def stop(self) -> None:
            pass

    class FailingSource(GovernedSource):
        fail = True

    pairs = [(SourceConfig(type="synthetic", name="pcs"), GovernedSource),
             (SourceConfig(type="synthetic", name="sass"), FailingSource)]  # fmt: skip
    monkeypatch.setattr(Config, "enabled_sources", lambda self: pairs)
    config = {"sources": [{"type": "synthetic"}], "sinks": [{"type": "file", "directory": str(tmp_path)}]}
    with cuptistream.session(config, quiet=True) as session:
        assert session.failed_sources == {"sass": "no SASS on this GPU"}
        assert session.governor is not None
        assert [t.source for t in session.governor.throttles] == ["pcs"]
        assert session.governor.share() == pytest.approx(0.01)  # the default budget, whole


def test_windows_of_different_sources_never_overlap() -> None:
    gov, _ = governor(0.01)
    assert gov.claim("pc_sampling")
    assert gov.claim("pc_sampling")  # a second context of the same source
    assert not gov.claim("sass")
    gov.release("pc_sampling")
    assert not gov.claim("sass")  # one pc_sampling window is still open
    gov.release("pc_sampling")
    assert gov.claim("sass")
    assert not gov.claim("pc_sampling")
    gov.release("pc_sampling")  # not the holder: nothing happens
    assert not gov.claim("pc_sampling")
    gov.leave("sass")  # a source that goes gives its slot back
    assert gov.claim("pc_sampling")
    gov.release("pc_sampling", every=True)
    assert gov.claim("sass")


def test_no_window_opens_while_the_last_one_settles() -> None:
    """After a SASS window the slot stays shut for its settle time: its patched kernels still run."""
    gov, _ = governor(0.01)
    assert gov.claim("sass")
    gov.release("sass", settle_s=0.3)
    assert not gov.claim("pc_sampling")
    time.sleep(0.35)
    assert gov.claim("pc_sampling")
    gov.release("pc_sampling")
    assert gov.claim("sass")  # no settle asked: the slot is free at once


def test_a_pc_sampling_window_waits_while_a_sass_window_is_open() -> None:
    from sources.pc_sampling.config import PcSamplingConfig
    from sources.pc_sampling.windows import Windows

    gov, _ = governor(0.01)
    windows = Windows(PcSamplingConfig(type="pc_sampling"), gov, "pc_sampling", {"windows": 0}, lambda: 1)
    assert gov.claim("sass")
    assert not windows.claim(ctx=7)
    gov.release("sass")
    assert windows.claim(ctx=7) and windows.claim(ctx=7)  # claiming twice for one context holds once
    assert not gov.claim("sass")
    windows.release(ctx=7)
    windows.release(ctx=7)  # a context released twice gives back only its own claim
    assert gov.claim("sass")
