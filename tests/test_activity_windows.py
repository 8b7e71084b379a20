"""Budget mode's window thread (sources/activity/windows.py) with the real governor.

CUPTI cannot exist on this machine, so the tracer here is a recording stand-in for the activity
source's ``begin_window``/``end_window`` (the GPU test tests/gpu/test_activity_budget_gpu.py runs the
real one); the scheduling, pricing and on-demand logic under test are the real ones."""

from __future__ import annotations

import threading
import time

import pytest

from cuptistream.channel.messages import WindowRecords
from cuptistream.config import load
from cuptistream.errors import ConfigError
from cuptistream.overhead import Governor, Throttle, WindowCost
from sources.activity.windows import UNIT_COST_S, Windows, price


class RecordingTracer:
    def __init__(self, records_per_window: dict[str, int] | None = None) -> None:
        self.name = "activity"
        self.log: list[tuple[str, int, bool]] = []  # ("open"/"close", window, on_demand)
        self.records = records_per_window
        self.windows: Windows | None = None
        self.refuse = False
        self._ids = 0
        self._on_demand: dict[int, bool] = {}
        self.lock = threading.Lock()
        self.helper_per_window = 0.0  # CPU seconds the window-only helper threads use per window
        self._helpers_s = 0.0

    def begin_window(self, on_demand: bool, request: int) -> int | None:
        if self.refuse:
            return None
        with self.lock:
            self._ids += 1
            self._on_demand[self._ids] = on_demand
            self.log.append(("open", self._ids, on_demand))
            return self._ids

    def end_window(self, window: int) -> None:
        with self.lock:
            self.log.append(("close", window, self._on_demand[window]))
            self._helpers_s += self.helper_per_window
        if self.records is not None and self.windows is not None:  # the collector's answer
            self.windows.priced(WindowRecords(stream=0, window=window, records=self.records))

    def helper_cpu_s(self) -> float:
        return self._helpers_s


def _throttle(budget: float | None, **kw: float) -> tuple[Governor, Throttle]:
    decisions: list[object] = []
    governor = Governor(budget, decisions.append)
    args = {
        "window_s": 0.05,
        "pause_s": 0.05,
        "prior_unit_cost": 0.6,
        "min_window_s": 0.01,
        "max_pause_s": 0.5,
    }
    args.update(kw)
    return governor, Throttle(governor, "activity", timestamp=time.monotonic_ns, **args)  # type: ignore[arg-type]


def _wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_price_uses_the_unit_costs() -> None:
    records = WindowRecords(stream=0, window=1, records={"kernel": 1000, "api": 2000, "nvtx_range": 10})
    assert price(records) == pytest.approx(
        1000 * UNIT_COST_S["kernel"] + 2000 * UNIT_COST_S["api"] + 10 * 2e-6
    )


def test_budget_windows_alternate_open_and_close_and_the_records_set_the_pause() -> None:
    # 10,000 kernels per 50 ms window cost 40 ms: the unit cost rises towards 0.8 s per open second,
    # so at a 10% budget the pause grows far beyond the 50 ms the prior gave.
    tracer = RecordingTracer({"kernel": 10_000})
    _, throttle = _throttle(0.10, max_pause_s=10.0)
    windows = Windows(tracer, throttle)
    tracer.windows = windows
    first_pause = throttle.plan.pause_s
    windows.start()
    _wait_for(lambda: throttle.windows >= 2, timeout=10)
    windows.stop()
    opens = [e for e in tracer.log if e[0] == "open"]
    closes = [e for e in tracer.log if e[0] == "close"]
    assert len(opens) == len(closes) >= 2  # stop closed the last one
    assert [e[1] for e in tracer.log[::2]] == [e[1] for e in tracer.log[1::2]]  # never two open
    assert throttle.unit_cost > 0.6
    assert throttle.plan.pause_s > first_pause
    assert windows.opened == len(opens)


def test_a_budget_window_is_charged_the_cpu_its_window_only_helpers_used() -> None:
    # The stack sampler samples only while a window is open and holds the GIL while it does: its CPU
    # seconds are the program's Python threads' wait, charged to the window beside the records.
    tracer = RecordingTracer({"kernel": 10})
    tracer.helper_per_window = 0.02
    _, throttle = _throttle(0.10)
    costs: list[WindowCost] = []
    take = throttle.window_done
    throttle.window_done = lambda cost: (costs.append(cost), take(cost))[1]  # type: ignore[method-assign]
    windows = Windows(tracer, throttle)
    tracer.windows = windows
    windows.start()
    _wait_for(lambda: len(costs) >= 2, timeout=10)
    windows.stop()
    assert all(0.02 <= cost.host_s < 0.03 for cost in costs), costs


def test_an_on_demand_window_opens_at_once_and_is_not_charged() -> None:
    tracer = RecordingTracer({"kernel": 10})
    _, throttle = _throttle(0.01, window_s=0.05, max_pause_s=60.0, pause_s=60.0)
    windows = Windows(tracer, throttle)
    tracer.windows = windows
    windows.start()
    began = time.monotonic()
    windows.request(0.2, request=7)
    _wait_for(lambda: any(e[0] == "close" and e[2] for e in tracer.log))
    took = time.monotonic() - began
    windows.stop()
    on_demand = [e for e in tracer.log if e[2]]
    assert [e[0] for e in on_demand] == ["open", "close"]
    assert 0.2 <= took < 2.0
    assert windows.on_demand == 1
    assert throttle.windows == windows.opened  # only budget windows were priced


def test_a_window_refused_while_cupti_is_another_tools_is_retried_after_a_pause() -> None:
    tracer = RecordingTracer({"kernel": 1})
    _, throttle = _throttle(None, window_s=0.02, pause_s=0.02)
    windows = Windows(tracer, throttle)
    tracer.windows = windows
    tracer.refuse = True
    windows.start()
    time.sleep(0.2)
    assert tracer.log == [] and windows.opened == 0
    tracer.refuse = False
    _wait_for(lambda: windows.opened >= 2)
    windows.stop()


def test_without_a_throttle_only_on_demand_windows_open() -> None:
    tracer = RecordingTracer()
    windows = Windows(tracer, None)
    windows.start()
    time.sleep(0.1)
    assert tracer.log == []
    windows.request(0.05, request=1)
    _wait_for(lambda: len(tracer.log) == 2)
    windows.stop()
    assert [e[0] for e in tracer.log] == ["open", "close"] and all(e[2] for e in tracer.log)


BUDGET_SETTINGS_THAT_CANNOT_WORK = [
    ({"kinds": ["concurrent_kernel"], "mode": "budget", "continuous": ["memcpy"]},
     "sources[0]: continuous: 'memcpy' is not in kinds; add it to kinds or remove it here"),
    ({"kinds": ["concurrent_kernel"], "continuous": ["concurrent_kernel"]},
     "sources[0]: continuous applies to mode: budget only; remove it or set mode: budget"),
    ({"min_window": "500ms", "window": "200ms"}, "sources[0]: min_window must be above 0 and at most window"),
    ({"max_pause": "100ms"}, "sources[0]: max_pause must be at least window, and pause above 0"),
    ({"kinds": ["concurrent_kernel", "memcpy"], "mode": "budget", "continuous": ["memcpy"],
      "between_windows": "detach"},
     "sources[0]: between_windows: detach leaves CUPTI between windows, which continuous kinds and "
     "detach: false need; set between_windows: attach, or remove continuous / detach: false"),
    ({"mode": "budget", "detach": False, "between_windows": "detach"},
     "sources[0]: between_windows: detach leaves CUPTI between windows, which continuous kinds and "
     "detach: false need; set between_windows: attach, or remove continuous / detach: false"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "expected"), BUDGET_SETTINGS_THAT_CANNOT_WORK)
def test_budget_mode_settings_that_cannot_work_are_refused_in_one_line(
    fields: dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load({"sinks": [{"type": "null"}], "sources": [{"type": "activity", **fields}]})
    assert str(info.value) == expected


def test_mode_and_records_take_only_their_values() -> None:
    for key in ("mode", "records"):
        with pytest.raises(ConfigError) as info:
            load({"sinks": [{"type": "null"}], "sources": [{"type": "activity", key: "sometimes"}]})
        assert str(info.value).startswith(f"sources[0].{key}: "), info.value
    config = load(
        {
            "sinks": [{"type": "null"}],
            "sources": [{"type": "activity", "mode": "budget", "records": "on_demand"}],
        }
    )
    source = config.sources[0]
    assert (source.mode, source.records) == ("budget", "on_demand")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fields", "detaches"),
    [
        ({"mode": "budget"}, False),  # the default stays attached: detaching is asked for
        ({"mode": "budget", "between_windows": "detach"}, True),
        ({"kinds": ["concurrent_kernel", "memcpy"], "mode": "budget", "continuous": ["memcpy"]}, False),
        ({"mode": "full"}, False),
        ({"mode": "full", "between_windows": "detach"}, False),  # full mode has no gaps
    ],
)
def test_between_windows_detaches_only_in_budget_mode_when_asked(
    fields: dict[str, object], detaches: bool
) -> None:
    config = load({"sinks": [{"type": "null"}], "sources": [{"type": "activity", **fields}]})
    assert config.sources[0].detaches_between_windows is detaches  # type: ignore[attr-defined]


def test_production_config_detaches_between_windows() -> None:
    """The always-on config detaches CUPTI between windows; the GPU tests (tests/gpu/test_budget_gpu.py,
    tests/gpu/test_detach_multigpu.py) prove that safe with graphs, launching threads and DDP."""
    from pathlib import Path

    config = load(Path(__file__).resolve().parent.parent / "configs" / "production.yaml")
    activity = next(s for s in config.sources if s.type == "activity")
    assert activity.mode == "budget" and activity.detaches_between_windows  # type: ignore[attr-defined]
