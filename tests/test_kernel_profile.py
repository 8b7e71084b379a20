"""Per-kernel metrics of an on-demand window (``trace --metrics``) without a GPU: the metric sets are
resolved with the real host metric library for GH100; the device side (contexts, CUPTI's range
profiler) is a stand-in that answers as the range profiler does: one range per kernel launch, in
launch order, named after the kernel, and a count of launches that did not fit."""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any

import pytest
from cupti import cupti

from cuptistream.cupti import driver
from cuptistream.cupti.api_functions import api_names
from cuptistream.cupti.kernel_metrics import SETS, KernelMetricChoice, choose, parse_spec
from cuptistream.cupti.launch_names import LaunchNames, kernel_launch_cbids
from cuptistream.cupti.range_profiler_api import Ranges
from cuptistream.cupti.subscriber import API_ENTER, API_EXIT, ApiCallbackData
from cuptistream.errors import ConfigError
from cuptistream.events import KernelMetrics
from cuptistream.sources.activity.kernel_profile import MAX_RANGES, UNNAMED, KernelProfile
from cuptistream.sources.activity.windows import Windows
from tests.test_sass_window import RecordingEmitter

NAN = math.nan


def test_the_sets_resolve_on_gh100_one_in_one_pass_one_in_several() -> None:
    utilization = choose("utilization", "GH100")
    assert utilization.metrics == list(SETS["utilization"]) and utilization.passes == 1
    light = choose("speed_of_light", "GH100")
    assert light.metrics == list(SETS["speed_of_light"]) and light.passes > 1  # kernel replay
    listed = choose("dram__bytes_read.sum, gpu__time_duration.sum,dram__bytes_read.sum", "GH100")
    assert listed.metrics == ["dram__bytes_read.sum", "gpu__time_duration.sum"] and listed.passes == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "--metrics: name a set (utilization, memory, speed_of_light) or metrics separated by commas"),
        ("utilisation", "--metrics: no set 'utilisation' (did you mean utilization?); sets: "),
        (
            "sm__cycles_activ.avg",
            "--metrics: 'sm__cycles_activ.avg' is not a metric on GH100; close matches: ",
        ),
    ],
)
def test_bad_metrics_are_one_line(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        choose(spec, "GH100")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_an_unknown_chip_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^--metrics: the installed CUPTI does not know the chip GZ999$"):
        choose("utilization", "GZ999")
    assert parse_spec("memory") == ["memory"]


class StandInSession:
    def __init__(self, ranges: Ranges, fail_start: bool = False) -> None:
        self.ranges, self.fail_start = ranges, fail_start
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")
        if self.fail_start:
            raise RuntimeError("CUPTI_ERROR_HARDWARE_BUSY")

    def stop(self) -> None:
        self.calls.append("stop")

    def collect(self) -> Ranges:
        self.calls.append("collect")
        return self.ranges

    def close(self) -> None:
        self.calls.append("close")


class StandInSide:
    """Two devices with contexts; each device's session hands back ``ranges[device]``."""

    def __init__(self, ranges: dict[int, Ranges], fail_start: set[int] | None = None) -> None:
        # CUPTI numbers its auto ranges; the names are those of the launches noted meanwhile
        self.kernels = {device: list(r.names) for device, r in ranges.items()}
        self.ranges = {
            d: Ranges([str(i) for i in range(len(r.names))], r.values, r.dropped) for d, r in ranges.items()
        }
        self.watching = False
        self.fail_start = fail_start or set()
        self.sessions: dict[int, StandInSession] = {}
        self.max_ranges: list[int] = []
        self.released = 0

    def contexts(self) -> dict[int, int]:
        return {device: 0xC0 + device for device in self.ranges}

    def chip(self, device: int) -> str:
        return "GH100"

    def session(self, device: int, context: int, choice: KernelMetricChoice, max_ranges: int) -> Any:
        assert context == 0xC0 + device
        self.max_ranges.append(max_ranges)
        self.sessions[device] = StandInSession(self.ranges[device], device in self.fail_start)
        return self.sessions[device]

    def watch_launches(self) -> None:
        self.watching = True

    def launched(self, context: int) -> list[str]:
        return self.kernels[context - 0xC0] if self.watching else []

    def release(self) -> None:
        self.released += 1


def _ranges(names: list[str], columns: list[list[float]], dropped: int = 0) -> Ranges:
    return Ranges(names, columns, dropped)


@pytest.fixture(autouse=True)
def _no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(1_000, 10**9, 1_000))
    monkeypatch.setattr(driver, "timestamp", lambda: next(clock))  # no CUPTI clock here


def test_each_device_gets_one_event_with_per_name_means_in_launch_order() -> None:
    gemm, add = "_Z4gemmv", "_Z3addv"
    metrics = ["gpu__time_duration.sum", "dram__bytes_read.sum"]
    side = StandInSide({
        0: _ranges([gemm, add, gemm, add, add], [[10, 1, 30, 2, 3], [100, NAN, 300, 20, 40]], dropped=7),
        1: _ranges([add], [[5], [50]]),
    })  # fmt: skip
    emitter = RecordingEmitter()
    profile = KernelProfile.open(",".join(metrics), emitter, "source:activity", side)
    profile.start()
    profile.finish()
    first, second = emitter.events
    assert isinstance(first, KernelMetrics) and isinstance(second, KernelMetrics)
    assert (first.device_id, first.chip, first.metrics, first.passes) == (0, "GH100", metrics, 1)
    assert first.names == [gemm, add] and first.launches == [2, 3] and first.not_profiled == 7
    assert first.values == [[20.0, 2.0], [200.0, 30.0]], "NaN readings are left out of the mean"
    assert second.names == [add] and second.values == [[5.0], [50.0]]
    assert first.start < first.end and emitter.errors == []
    assert side.max_ranges == [MAX_RANGES, MAX_RANGES] and side.released == 1
    assert side.sessions[0].calls == ["start", "stop", "collect", "close"]


def test_a_device_whose_profiler_will_not_start_is_an_error_and_the_others_go_on() -> None:
    side = StandInSide({0: _ranges(["k"], [[1.0]]), 1: _ranges(["k"], [[2.0]])}, fail_start={0})
    emitter = RecordingEmitter()
    profile = KernelProfile.open("gpu__time_duration.sum", emitter, "source:activity", side)
    profile.start()
    profile.finish()
    (event,) = emitter.events
    assert isinstance(event, KernelMetrics) and event.device_id == 1
    ((origin, message, severity, _),) = emitter.errors
    assert origin == "source:activity" and severity == "error"
    assert message == "kernel metrics of device 0 could not start: RuntimeError: CUPTI_ERROR_HARDWARE_BUSY"
    assert side.sessions[0].calls == ["start", "close"] and side.released == 1


def test_open_refuses_without_a_context_or_with_bad_metrics_and_releases() -> None:
    side = StandInSide({})
    with pytest.raises(RuntimeError, match="no CUDA context in this process yet"):
        KernelProfile.open("utilization", RecordingEmitter(), "source:activity", side)
    side = StandInSide({0: _ranges([], [[]])})
    with pytest.raises(ConfigError, match="not a metric on GH100"):
        KernelProfile.open("sm__nothing.sum", RecordingEmitter(), "source:activity", side)
    assert side.released == 1


class Tracer:
    name = "activity"

    def __init__(self, opens: bool) -> None:
        self.opens = opens
        self.calls: list[str] = []

    def begin_window(self, on_demand: bool, request: int) -> int | None:
        self.calls.append("begin")
        return 1 if self.opens else None

    def end_window(self, window: int) -> None:
        self.calls.append("end")

    def helper_cpu_s(self) -> float:
        return 0.0


class Profile:
    def __init__(self, calls: list[str], done: threading.Event) -> None:
        self.calls, self.done = calls, done

    def start(self) -> None:
        self.calls.append("profile start")

    def finish(self) -> None:
        self.calls.append("profile finish")

    def cancel(self) -> None:
        self.calls.append("profile cancel")
        self.done.set()


@pytest.mark.parametrize("opens", [True, False])
def test_the_profile_runs_inside_the_window_and_is_cancelled_when_none_opens(opens: bool) -> None:
    tracer = Tracer(opens)
    done = threading.Event()
    windows = Windows(tracer, throttle=None)
    windows.start()
    windows.request(0.05, 1, Profile(tracer.calls, done))
    if opens:
        while "end" not in tracer.calls:
            done.wait(0.01)
    else:
        assert done.wait(5)
    windows.stop()
    expected = ["begin", "profile start", "profile finish", "end"] if opens else ["begin", "profile cancel"]
    assert tracer.calls == expected


def test_ranges_past_the_launches_noted_are_unnamed() -> None:
    side = StandInSide({0: _ranges(["gemm", "add", "add"], [[1.0, 2.0, 4.0]])})
    side.kernels[0] = ["gemm"]  # the second launch was a CUDA graph's: what follows cannot be matched
    emitter = RecordingEmitter()
    profile = KernelProfile.open("gpu__time_duration.sum", emitter, "source:activity", side)
    profile.start()
    profile.finish()
    (event,) = emitter.events
    assert isinstance(event, KernelMetrics)
    assert event.names == ["gemm", UNNAMED] and event.launches == [1, 2] and event.values == [[1.0, 3.0]]


def _launch(names: LaunchNames, cbid: int, context: int, symbol: bytes | None, site: int = API_ENTER) -> None:
    name = ctypes.create_string_buffer(symbol) if symbol is not None else None
    info = ApiCallbackData(
        callbackSite=site, context=context, symbolName=ctypes.addressof(name) if name else None
    )
    names._on_launch(1, cbid, ctypes.addressof(info))


def test_launch_names_are_noted_per_context_in_order_up_to_a_graph_launch() -> None:
    """The driver callbacks' data as CUPTI hands it (``CUpti_CallbackData``); no CUPTI here to call them."""
    names = LaunchNames()
    cbids = {api_names("driver")[cbid]: cbid for cbid in kernel_launch_cbids(cupti)}
    assert {"cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch"} <= set(cbids)
    assert not any("HostFunc" in name for name in cbids)
    _launch(names, cbids["cuLaunchKernel"], 0xA, b"_Z4gemmv")
    _launch(names, cbids["cuLaunchKernelEx"], 0xB, b"_Z3addv")
    _launch(names, cbids["cuLaunchKernel"], 0xA, b"_Z3addv", site=API_EXIT)  # noted at the entry only
    _launch(names, cbids["cuLaunchKernelEx"], 0xA, b"_Z3addv")
    _launch(names, cbids["cuGraphLaunch"], 0xA, None)
    _launch(names, cbids["cuLaunchKernel"], 0xA, b"_Z4gemmv")
    assert names.names(0xA) == ["_Z4gemmv", "_Z3addv"] and names.names(0xB) == ["_Z3addv"]
    assert names.names(0xC) == []
