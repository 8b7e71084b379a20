"""PC sampling source control logic: duty cycle, launch control, GetData hand-off, losses, adaptation.

No GPU here, so CUPTI cannot run. What stands in for it, and only that:

- ``FakePcSampling`` takes the ``pcsampling_api`` calls (Enable, Disable, Start, Stop, GetData,
  SetConfigurationAttribute, stall reasons). Its GetData and Disable write real
  ``CUpti_PCSamplingPCData`` records, stall-reason pairs and C function names into the ctypes
  buffers the source handed over, so the source's real decoder reads them from process memory.
- the context look-ups (``context_ids``, ``current_context``, ``active_primary_contexts``,
  ``module_data``), the driver's attach/clock calls and the callback subscriber.

The schedule is driven by calling ``Schedule.tick``, ``Drains.drain`` and ``Drains.decode_filled``
(``source._schedule``, ``source._drains``) with chosen times on a fake clock; the worker thread only
runs in the launch-control test.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from cuptistream.config import convert
from cuptistream.cupti import driver, subscriber
from cuptistream.cupti import pcsampling_api as pcs
from cuptistream.cupti.contexts import CONTEXT_CREATED, CONTEXT_DESTROY_STARTING, MODULE_UNLOAD_STARTING
from cuptistream.cupti.launch_hook import LaunchHook
from cuptistream.cupti.subscriber import API_EXIT
from cuptistream.events import PcSample, PcSampleBatch, ResourceChange
from cuptistream.sources.pc_sampling import PcSamplingConfig, PcSamplingSource
from cuptistream.sources.pc_sampling import adapt as pc_adapt
from cuptistream.sources.pc_sampling import attach as pc_attach
from cuptistream.sources.pc_sampling import drain as pc_drain
from cuptistream.sources.pc_sampling import schedule as pc_schedule
from cuptistream.sources.pc_sampling import source as pc_source
from cuptistream.sources.pc_sampling import windows as pc_windows
from tests.test_launch_hook import FAKE_CUPTI, RUNTIME, FakeSubscriber
from tests.test_sass_window import RecordingEmitter

CTX_A, CTX_B, CTX_C = 0xA000, 0xB000, 0xC000
IDS = {CTX_A: (0, 11), CTX_B: (0, 12), CTX_C: (1, 13)}  # ctx -> (device id, CUPTI context id)
STALLS = {
    0: "smsp__pcsamp_warps_issue_stalled_long_scoreboard",
    1: "smsp__pcsamp_warps_issue_stalled_math_pipe_throttle",
    2: "smsp__pcsamp_warps_issue_stalled_barrier",
    3: "smsp__pcsamp_warps_issue_stalled_not_selected",
}
LONG, MATH, BARRIER, NOT_SELECTED = STALLS.values()
T0 = 1000.0
STAGE = "pc_sampling"


@dataclass
class Pc:
    """One PC as CUPTI reports it: function, offset and samples per stall-reason index."""

    function: str
    offset: int
    stalls: dict[int, int]
    crc: int = 0x1234_5678_9ABC
    function_index: int = 2

    def expected(self) -> PcSample:
        return PcSample(
            cubin_crc=self.crc,
            function_name=self.function,
            function_index=self.function_index,
            pc_offset=self.offset,
            stalls={STALLS[i]: n for i, n in self.stalls.items() if n},
        )


class FakePcSampling:
    """Stands in for CUPTI's PC sampling API, which needs a GPU that CI does not have.

    ``pending`` holds the PCs CUPTI has collected; GetData writes up to ``collectNumPcs`` of them
    into the buffer it is given and reports the rest as ``remainingNumPcs``. Disable writes
    ``at_disable`` into the buffer set as ``SAMPLING_DATA_BUFFER``, as CUPTI does.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.threads: list[int] = []  # the thread of each call in ``calls``
        self.attributes: list[tuple[int, dict[int, Any]]] = []
        self.pending: list[Pc] = []
        self.dropped = 0  # droppedSamples of the next GetData
        self.hardware_full = False
        self.codes: list[int] = []  # results of the next GetData calls (default CUPTI_SUCCESS)
        self.at_disable: list[Pc] = []
        self.remaining_at_disable = 0
        self.dropped_at_disable = 0
        self.final: dict[int, int] = {}  # ctx -> SAMPLING_DATA_BUFFER address
        self.fail: dict[str, int] = {}  # call -> CUptiResult to fail with
        self.hang: dict[str, threading.Event] = {}  # call -> event it waits for
        self.before: dict[str, Callable[[], None]] = {}  # call -> run first (to look at the source then)
        self._names: dict[str, ctypes.Array[ctypes.c_char]] = {}  # kept alive: records point into them

    def _record(self, call: str, ctx: int) -> None:
        self.calls.append((call, ctx))
        self.threads.append(threading.get_ident())
        if call in self.before:
            self.before[call]()
        if call in self.hang:
            self.hang[call].wait(2.0)
        if call in self.fail:
            raise pcs.CuptiError(f"cuptiPCSampling{call.title()}", self.fail[call], "fake failure")

    def enable(self, ctx: int) -> None:
        self._record("enable", ctx)

    def start(self, ctx: int) -> None:
        self._record("start", ctx)

    def stop(self, ctx: int) -> None:
        self._record("stop", ctx)

    def disable(self, ctx: int) -> None:
        self._record("disable", ctx)
        if ctx in self.final and (self.at_disable or self.remaining_at_disable or self.dropped_at_disable):
            data = pcs.PCSamplingData.from_address(self.final[ctx])
            self._write(data, self.at_disable, self.dropped_at_disable, self.remaining_at_disable)
            self.at_disable, self.dropped_at_disable, self.remaining_at_disable = [], 0, 0

    def stall_reasons(self, ctx: int) -> dict[int, str]:
        return dict(STALLS)

    def set_attributes(self, ctx: int, infos: list[pcs.ConfigurationInfo]) -> None:
        self._record("set_attributes", ctx)
        values: dict[int, Any] = {}
        for info in infos:
            data = info.attributeData
            kind = info.attributeType
            if kind == pcs.ATTR_SAMPLING_PERIOD:
                values[kind] = data.samplingPeriod
            elif kind == pcs.ATTR_ENABLE_START_STOP_CONTROL:
                values[kind] = data.enableStartStopControl
            elif kind == pcs.ATTR_SAMPLING_DATA_BUFFER:
                values[kind] = data.samplingDataBuffer
                self.final[ctx] = data.samplingDataBuffer
            elif kind == pcs.ATTR_STALL_REASON:
                reasons = data.stallReasonData
                values[kind] = [reasons.pStallReasonIndex[i] for i in range(reasons.stallReasonCount)]
            else:
                values[kind] = None
        self.attributes.append((ctx, values))

    def get_data(self, ctx: int, data: pcs.PCSamplingData) -> int:
        self._record("get_data", ctx)
        code = self.codes.pop(0) if self.codes else pcs.SUCCESS
        if code != pcs.SUCCESS:
            return code
        take, self.pending = self.pending[: data.collectNumPcs], self.pending[data.collectNumPcs :]
        self._write(data, take, self.dropped, len(self.pending))
        self.dropped = 0
        return pcs.SUCCESS

    def _write(self, data: pcs.PCSamplingData, pcs_: list[Pc], dropped: int, remaining: int) -> None:
        assert len(pcs_) <= data.collectNumPcs
        records = (pcs.PCData * data.collectNumPcs).from_address(data.pPcData)
        for i, pc in enumerate(pcs_):
            record = records[i]
            # CUPTI writes at most stallReasonCount reasons: the source must have reset the capacity.
            assert record.stallReasonCount >= len(pc.stalls), "stall-reason capacity not restored"
            record.cubinCrc, record.pcOffset, record.functionIndex = pc.crc, pc.offset, pc.function_index
            name = self._names.get(pc.function)
            if name is None:
                name = self._names[pc.function] = ctypes.create_string_buffer(pc.function.encode())
            record.functionName = ctypes.addressof(name)
            pairs = (pcs.StallReason * max(1, len(pc.stalls))).from_address(record.stallReason)
            for j, (index, samples) in enumerate(pc.stalls.items()):
                pairs[j].pcSamplingStallReasonIndex, pairs[j].samples = index, samples
            record.stallReasonCount = len(pc.stalls)
        data.totalNumPcs = len(pcs_)
        data.remainingNumPcs = remaining
        data.totalSamples = sum(sum(pc.stalls.values()) for pc in pcs_) + dropped
        data.droppedSamples = dropped
        data.nonUsrKernelsTotalSamples = 0
        data.hardwareBufferFull = int(self.hardware_full)
        data.rangeId = 0


class FakeClock:
    """The source's ``time`` module, with a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = T0
        self.perf_counter = time.perf_counter
        self.time_ns = time.time_ns

    def monotonic(self) -> float:
        return self.now


class Harness:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, contexts: list[int], **config: Any) -> None:
        self.fake = FakePcSampling()
        self.sub = FakeSubscriber()
        self.clock = FakeClock()
        self.emitter = RecordingEmitter()
        self.released: list[str] = []
        fake = self.fake
        for name in ("enable", "disable", "start", "stop", "get_data", "set_attributes", "stall_reasons"):
            # Stands in for the CUPTI PC sampling call of that name, which needs a GPU CI does not have.
            monkeypatch.setattr(pcs, name, getattr(fake, name))
        # Stands in for cuptiGetResultString (CUPTI needs a GPU that CI does not have).
        monkeypatch.setattr(pcs, "result_string", lambda code: f"CUPTI error {code}")
        # Stand in for the CUDA driver / CUPTI context look-ups, which need a GPU that CI does not have.
        monkeypatch.setattr(pc_attach, "context_ids", lambda ctx: IDS[ctx])
        monkeypatch.setattr(pc_source, "current_context", lambda: 0)
        monkeypatch.setattr(pc_source, "active_primary_contexts", lambda: list(contexts))
        monkeypatch.setattr(pc_source, "module_data", lambda address: (5, 0, 0))
        # Stand in for CUPTI attach/detach and cuptiGetTimestamp (need a GPU that CI does not have).
        monkeypatch.setattr(driver, "require_gpu", lambda: None)
        monkeypatch.setattr(driver, "acquire", lambda user: None)
        monkeypatch.setattr(driver, "release", self.released.append)
        ticks = iter(range(10**6, 10**9))
        monkeypatch.setattr(driver, "timestamp", lambda: next(ticks))
        # Stands in for the CUPTI callback subscriber, which needs a GPU that CI does not have.
        monkeypatch.setattr(subscriber, "register", self.sub.register)
        # Stands in for cupti-python's cbid enums in the launch hook (CUPTI needs a GPU).
        monkeypatch.setattr(pc_schedule, "LaunchHook", lambda action: LaunchHook(action, cupti=FAKE_CUPTI))
        # The source's clock (``time.monotonic``), in every module of it that reads it.
        for module in (pc_adapt, pc_attach, pc_drain, pc_schedule):
            monkeypatch.setattr(module, "time", self.clock)
        self.monkeypatch = monkeypatch
        cfg = {
            "type": "pc_sampling",
            "control": "worker",
            "duty_cycle": {"on": 1, "off": 4},
            "get_data_interval": 0.5,
            "min_get_data_interval": 0.125,
            "collect_pcs": 8,
            "watchdog_timeout": 5,
            **config,
        }
        self.source = PcSamplingSource(convert(cfg, PcSamplingConfig), self.emitter)
        self.started = self.stopped = False

    def start(self, worker: bool = False) -> PcSamplingSource:
        if not worker:
            # The test drives the schedule itself: the worker thread starts and returns at once.
            self.monkeypatch.setattr(pc_schedule.Schedule, "run", lambda self: None)
        self.source.start()
        self.started = True
        return self.source

    def stop(self) -> None:
        if self.started and not self.stopped:
            self.stopped = True
            self.source.stop()

    def state(self, ctx: int = CTX_A) -> Any:
        return self.source._sampled[ctx]

    def calls(self, ctx: int | None = None) -> list[str]:
        return [call for call, c in self.fake.calls if ctx is None or c == ctx]

    def batches(self) -> list[PcSampleBatch]:
        return [e for e in self.emitter.events if isinstance(e, PcSampleBatch)]

    def resource_handler(self, cbid: int) -> Callable[[int, int, Any], None]:
        return next(r.handler for r in self.sub.active if r.domain == 3 and r.cbid == cbid)


@pytest.fixture
def make(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def factory(contexts: list[int] | None = None, **config: Any) -> Harness:
        harness = Harness(monkeypatch, [CTX_A] if contexts is None else contexts, **config)
        made.append(harness)
        return harness

    yield factory
    for harness in made:
        harness.stop()


def test_start_stop_duty_cycle(make: Callable[..., Harness]) -> None:
    h = make()
    source = h.start()
    state = h.state()
    assert h.calls() == ["enable", "set_attributes"]
    ctx, attrs = h.fake.attributes[0]
    assert ctx == CTX_A and attrs[pcs.ATTR_ENABLE_START_STOP_CONTROL] == 1
    assert attrs[pcs.ATTR_SAMPLING_PERIOD] == 20 and attrs[pcs.ATTR_STALL_REASON] == [0, 1, 2, 3]
    assert attrs[pcs.ATTR_SAMPLING_DATA_BUFFER] == state.final.address
    assert not state.started  # start/stop control: nothing samples before the first Start

    assert source._schedule.tick(state, T0) == T0 + 0.5  # window opens; first drain due
    assert h.calls()[2:] == ["start"]
    assert source._schedule.tick(state, T0 + 0.25) == T0 + 0.5  # nothing due yet
    assert h.calls()[2:] == ["start"]
    assert source._schedule.tick(state, T0 + 0.5) == T0 + 1.0  # periodic drain; window ends at T0+1
    assert h.calls()[2:] == ["start", "get_data"]
    assert source._schedule.tick(state, T0 + 1.0) == T0 + 5.0  # window closes: Stop, then GetData
    assert h.calls()[2:] == ["start", "get_data", "stop", "get_data"]
    assert not state.started
    assert source._schedule.tick(state, T0 + 4.0) == T0 + 5.0  # off: no call, no drain
    assert h.calls()[2:] == ["start", "get_data", "stop", "get_data"]
    assert source._schedule.tick(state, T0 + 5.0) == T0 + 5.5  # the next window
    assert h.calls()[2:] == ["start", "get_data", "stop", "get_data", "start"]
    assert "disable" not in h.calls() and h.calls().count("enable") == 1
    h.stop()
    assert h.calls()[-3:] == ["stop", "get_data", "disable"]
    assert h.released == ["pc_sampling"]


def test_enable_disable_duty_cycle(make: Callable[..., Harness]) -> None:
    h = make(duty_cycle={"on": 1, "off": 4, "method": "enable_disable"})
    source = h.start()
    state = h.state()
    first = h.fake.attributes[0][1]
    assert first[pcs.ATTR_ENABLE_START_STOP_CONTROL] == 0
    assert state.started  # Enable opened the first window
    window = [Pc("window_kernel", 0x10, {0: 3}), Pc("window_kernel", 0x20, {1: 2})]
    h.fake.pending = list(window)
    assert source._schedule.tick(state, T0 + 0.5) == T0 + 1.0
    assert h.calls()[2:] == ["get_data"]
    # What Disable leaves in the final buffer: one PC, 5 dropped samples, 2 PCs it could not write.
    last = Pc("tail_kernel", 0x400, {2: 4, 3: 1})
    h.fake.at_disable, h.fake.dropped_at_disable, h.fake.remaining_at_disable = [last], 5, 2
    assert source._schedule.tick(state, T0 + 1.0) == T0 + 5.0  # window closes: drain, then Disable
    assert h.calls()[2:] == ["get_data", "get_data", "disable"]
    assert not state.started and not state.enabled
    source.flush()  # off window: a disabled context gets no GetData
    assert h.calls()[2:] == ["get_data", "get_data", "disable"]
    batches = h.batches()
    assert [b.samples for b in batches] == [[pc.expected() for pc in window], [last.expected()]]
    assert batches[1].dropped_samples == 5 and batches[1].context_id == 11
    # The final buffer is decoded with at_end: its losses are reported, and no adaptation follows.
    assert h.emitter.losses == [
        (STAGE, "hardware_dropped", 5, "samples"),
        (STAGE, "not_collected_at_disable", 2, "pcs"),
    ]
    assert h.emitter.errors == [] and source._adaptation.interval == 0.5
    assert state.final not in state.spare
    assert source._schedule.tick(state, T0 + 5.0) == T0 + 5.5  # the next window: Enable and configure again
    assert h.calls()[2:] == ["get_data", "get_data", "disable", "enable", "set_attributes"]
    again = h.fake.attributes[-1][1]
    assert again[pcs.ATTR_SAMPLING_DATA_BUFFER] == state.final.address
    assert again[pcs.ATTR_ENABLE_START_STOP_CONTROL] == 0 and again[pcs.ATTR_SAMPLING_PERIOD] == 20
    assert state.started and state.enabled
    h.stop()
    assert h.calls()[-2:] == ["get_data", "disable"] and "start" not in h.calls() and "stop" not in h.calls()


def test_reopening_decodes_the_last_final_buffer_before_enable(make: Callable[..., Harness]) -> None:
    h = make(duty_cycle={"on": 1, "off": 4, "method": "enable_disable"})
    source = h.start()
    state = h.state()
    h.fake.at_disable = [Pc("tail_kernel", 0x400, {2: 4})]
    source._schedule.tick(state, T0 + 1.0)
    assert h.batches() == [] and source._drains.filled[-1].at_end  # the worker has not decoded it yet
    batches_at_enable: list[int] = []
    h.fake.before["enable"] = lambda: batches_at_enable.append(len(h.batches()))
    source._schedule.tick(state, T0 + 5.0)
    assert h.calls()[-2:] == ["enable", "set_attributes"]
    assert batches_at_enable == [1]  # decoded before CUPTI may write the final buffer again
    assert h.batches()[0].samples[0].function_name == "tail_kernel"


def test_stop_in_the_off_window_of_enable_disable_makes_no_call(make: Callable[..., Harness]) -> None:
    h = make(duty_cycle={"on": 1, "off": 4, "method": "enable_disable"})
    source = h.start()
    source._schedule.tick(h.state(), T0 + 1.0)
    assert h.calls()[-2:] == ["get_data", "disable"]
    calls = len(h.fake.calls)
    h.stop()  # disabled already: no GetData, no second Disable
    assert len(h.fake.calls) == calls and h.released == ["pc_sampling"]


def test_continuous_without_duty_cycle_only_drains(make: Callable[..., Harness]) -> None:
    h = make(duty_cycle={"on": 1, "off": 0})
    source = h.start()
    state = h.state()
    assert h.fake.attributes[0][1][pcs.ATTR_ENABLE_START_STOP_CONTROL] == 0 and state.started
    assert source._schedule.tick(state, T0 + 0.5) == T0 + 1.0
    assert source._schedule.tick(state, T0 + 50.0) == T0 + 50.5  # no window ever closes
    assert h.calls()[2:] == ["get_data", "get_data"]


def _wait_for(condition: Callable[[], bool], seconds: float = 0.3) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_launch_control_arms_the_hook_only_when_due(make: Callable[..., Harness]) -> None:
    h = make(
        contexts=[],
        control="launch",
        duty_cycle={"on": 30, "off": 30},
        get_data_interval=30,
    )
    h.clock.now = time.monotonic()  # the real worker thread runs here: one clock for both
    h.clock.monotonic = time.monotonic  # type: ignore[method-assign]
    source = h.start(worker=True)

    def launch_registrations() -> set[tuple[int, int | None]]:
        return {key for key in h.sub.registered() if key[0] != 3}

    time.sleep(0.05)
    assert launch_registrations() == set()  # no context, nothing due: the hook stays off
    h.resource_handler(CONTEXT_CREATED)(3, CONTEXT_CREATED, SimpleNamespace(context=CTX_A))
    assert h.calls() == ["enable", "set_attributes"]
    assert _wait_for(lambda: bool(launch_registrations()))  # the first window is due: armed
    assert "start" not in h.calls()  # the worker does not call CUPTI itself
    h.sub.launch(RUNTIME, 211, API_EXIT, CTX_A)  # the application's next launch runs the tick
    assert h.calls() == ["enable", "set_attributes", "start"]
    assert _wait_for(lambda: not launch_registrations())  # next due in 30 s: disarmed
    h.sub.launch(RUNTIME, 211, API_EXIT, CTX_A)
    assert h.calls().count("start") == 1
    assert source.stats["launch_actions"] == 1
    h.stop()
    assert h.calls() == ["enable", "set_attributes", "start", "stop", "get_data", "disable"]
    assert set(h.fake.threads) == {threading.get_ident()}  # every CUPTI call on the test's thread
    assert h.sub.active == []


def test_launch_action_ticks_only_its_own_context(make: Callable[..., Harness]) -> None:
    h = make(contexts=[CTX_A, CTX_C])
    source = h.start()
    source._schedule.on_launch_due(CTX_C)
    assert h.calls(CTX_C)[-1] == "start" and "start" not in h.calls(CTX_A)
    source._schedule.on_launch_due(0xDEAD)  # a context we do not sample
    assert h.calls().count("start") == 1
    assert source.stats["launch_actions"] == 2


def test_get_data_hands_off_and_the_worker_decodes(make: Callable[..., Harness]) -> None:
    h = make()
    source = h.start()
    state = h.state()
    source._schedule.tick(state, T0)
    first = [Pc("gemm", 0x100, {0: 7, 1: 2}), Pc("softmax", 0x2F0, {2: 1})]
    h.fake.pending = list(first)
    source._schedule.tick(state, T0 + 0.5)
    assert h.calls()[-1] == "get_data"
    assert h.batches() == []  # GetData ran; decoding waits for the worker
    assert len(source._drains.filled) == 1 and state.buffers == 1 and state.spare == []
    source._drains.decode_filled()
    (batch,) = h.batches()
    assert batch.samples == [pc.expected() for pc in first]
    assert batch.samples[0].stalls == {LONG: 7, MATH: 2} and batch.samples[1].stalls == {BARRIER: 1}
    assert (batch.device_id, batch.context_id, batch.total_samples) == (0, 11, 10)
    assert len(state.spare) == 1 and not source._drains.filled
    # The buffer is reused; CUPTI may write more reasons per PC now than last time.
    second = [Pc("gemm", 0x100, {0: 1, 1: 1, 2: 1, 3: 1})]
    h.fake.pending = list(second)
    source._drains.drain(state)
    source._drains.decode_filled()
    assert state.buffers == 1
    assert h.batches()[-1].samples == [second[0].expected()]
    assert h.batches()[-1].samples[0].stalls == {LONG: 1, MATH: 1, BARRIER: 1, NOT_SELECTED: 1}
    assert source.stats["pcs"] == 3 and source.stats["batches"] == 2
    assert source.stats["function_names"] == 2  # each name pointer read once


def test_when_every_buffer_waits_the_drain_decodes_inline(make: Callable[..., Harness]) -> None:
    h = make()
    source = h.start()
    state = h.state()
    source._schedule.tick(state, T0)
    batches_at_call: list[int] = []
    h.fake.before["get_data"] = lambda: batches_at_call.append(len(h.batches()))
    for i in range(pc_drain._BUFFERS_PER_CONTEXT):
        h.fake.pending = [Pc(f"k{i}", 0x10 * i, {0: i + 1})]
        source._drains.drain(state)
    assert state.buffers == pc_drain._BUFFERS_PER_CONTEXT and len(source._drains.filled) == 4
    assert h.batches() == []
    h.fake.pending = [Pc("k4", 0x40, {1: 9})]
    source._drains.drain(state)  # no free buffer: the four waiting ones are decoded first, on this thread
    assert batches_at_call == [0, 0, 0, 0, 4]
    assert state.buffers == pc_drain._BUFFERS_PER_CONTEXT and len(source._drains.filled) == 1
    source._drains.decode_filled()
    assert [b.samples[0].function_name for b in h.batches()] == ["k0", "k1", "k2", "k3", "k4"]


def test_remaining_pcs_are_fetched_in_the_same_drain(make: Callable[..., Harness]) -> None:
    h = make(collect_pcs=2)
    source = h.start()
    state = h.state()
    source._schedule.tick(state, T0)
    pcs_ = [Pc("k", 0x10 * i, {i % 4: i + 1}) for i in range(5)]
    h.fake.pending = list(pcs_)
    source._drains.drain(state)
    assert h.calls().count("get_data") == 3 and len(source._drains.filled) == 3
    source._drains.decode_filled()
    assert [len(b.samples) for b in h.batches()] == [2, 2, 1]
    assert [s for b in h.batches() for s in b.samples] == [pc.expected() for pc in pcs_]
    assert h.emitter.losses == [] and h.emitter.errors == []


def test_dropped_samples_are_a_loss_and_halve_the_drain_interval(make: Callable[..., Harness]) -> None:
    h = make(duty_cycle={"on": 2, "off": 4})
    source = h.start()
    state = h.state()
    source._schedule.tick(state, T0)
    h.fake.dropped = 7
    assert source._schedule.tick(state, T0 + 0.5) == T0 + 1.0
    assert h.emitter.losses == []  # not before decoding
    source._drains.decode_filled()
    assert h.emitter.losses == [(STAGE, "hardware_dropped", 7, "samples")]
    assert h.batches()[0].dropped_samples == 7
    (origin, message, severity, _) = h.emitter.errors[0]
    assert origin == "source:pc_sampling" and severity == "warning"
    assert message == "PC sampling adapts: samples were lost; draining every 0.25 s"
    assert source._adaptation.interval == 0.25 and source.stats["dropped"] == 7
    assert source._schedule.tick(state, T0 + 1.0) == T0 + 1.25  # the next drain comes sooner


def test_out_of_memory_is_a_full_hardware_buffer(make: Callable[..., Harness]) -> None:
    h = make()
    source = h.start()
    state = h.state()
    source._schedule.tick(state, T0)
    h.fake.codes = [pcs.ERROR_OUT_OF_MEMORY]
    h.fake.pending = [Pc("k", 0x10, {0: 1})]
    source._drains.drain(state)
    assert h.calls().count("get_data") == 1  # no retry in the same drain
    assert h.emitter.losses == [(STAGE, "hardware_buffer_full", 1, "buffers")]
    assert [e[1] for e in h.emitter.errors] == [
        "PC sampling adapts: the hardware buffer filled; draining every 0.25 s"
    ]
    assert not source._drains.filled and state.spare and state.buffers == 1  # the buffer went back
    # Any other GetData failure is an error event; the schedule backs off.
    h.fake.codes = [pcs.ERROR_INVALID_OPERATION]
    assert source._schedule.tick_reporting(state, T0 + 0.5) == T0 + 1.5
    assert h.emitter.errors[-1][1:] == (
        "cuptiPCSamplingGetData failed: CUPTI error 7 (CUptiResult 7)",
        "error",
        pcs.ERROR_INVALID_OPERATION,
    )
    assert state.buffers == 1 and len(state.spare) == 1


def test_hardware_buffer_full_flag_is_a_loss(make: Callable[..., Harness]) -> None:
    h = make()
    source = h.start()
    state = h.state()
    source._schedule.tick(state, T0)
    h.fake.hardware_full = True
    h.fake.pending = [Pc("k", 0x10, {0: 1})]
    source._drains.drain(state)
    source._drains.decode_filled()
    assert h.emitter.losses == [(STAGE, "hardware_buffer_full", 1, "buffers")]
    assert h.batches()[0].hardware_buffer_full


def test_at_the_interval_floor_a_loss_lengthens_the_sampling_period(make: Callable[..., Harness]) -> None:
    h = make(get_data_interval=0.25, max_sampling_period=21, duty_cycle={"on": 10, "off": 4})
    source = h.start()
    state = h.state()
    source._schedule.tick(state, T0)

    def lose() -> None:
        h.fake.dropped = 1
        source._drains.drain(state)
        source._drains.decode_filled()

    lose()
    assert source._adaptation.interval == 0.125 and state.wanted_period == 20
    lose()  # within one interval of the last step: no second step yet
    assert len(h.emitter.errors) == 1 and state.wanted_period == 20
    h.clock.now += 1.0
    lose()
    assert h.emitter.errors[-1][1] == "PC sampling adapts: samples were lost; sampling period to 2^21 cycles"
    assert state.wanted_period == 21 and state.period == 20
    assert h.calls().count("set_attributes") == 1  # not applied by the decoding thread
    source._schedule.tick(state, h.clock.now)  # the next tick sets it, before anything else
    assert h.fake.attributes[-1] == (CTX_A, {pcs.ATTR_SAMPLING_PERIOD: 21})
    assert state.period == 21
    calls = h.calls().count("set_attributes")
    source._schedule.tick(state, h.clock.now + 0.125)
    assert h.calls().count("set_attributes") == calls  # applied once
    h.clock.now += 1.0
    lose()  # at max_sampling_period: nothing more to change
    assert len(h.emitter.errors) == 2 and state.wanted_period == 21
    assert len(h.emitter.losses) == 4


def test_a_refused_period_is_reported_and_kept(make: Callable[..., Harness]) -> None:
    h = make()
    source = h.start()
    state = h.state()
    state.wanted_period = 22
    h.fake.fail["set_attributes"] = pcs.ERROR_INVALID_PARAMETER
    source._schedule.tick(state, T0)
    assert state.period == 20 and state.wanted_period == 20
    assert h.emitter.errors[-1][1].startswith("could not lengthen the sampling period")
    assert h.calls()[-1] == "start"  # the window still opened


def test_a_second_context_on_the_same_gpu_is_not_sampled(make: Callable[..., Harness]) -> None:
    h = make()
    source = h.start()
    created = h.resource_handler(CONTEXT_CREATED)
    created(3, CONTEXT_CREATED, SimpleNamespace(context=CTX_B))
    assert CTX_B not in source._sampled and "enable" not in h.calls(CTX_B)
    (origin, message, severity, _) = h.emitter.errors[0]
    assert severity == "warning" and origin == "source:pc_sampling"
    assert message == (
        "GPU 0 already has PC sampling on context 11; CUPTI samples one context per GPU, "
        "so context 12 is not sampled"
    )
    created(3, CONTEXT_CREATED, SimpleNamespace(context=CTX_B))
    assert len(h.emitter.errors) == 1  # said once
    created(3, CONTEXT_CREATED, SimpleNamespace(context=CTX_C))  # another GPU: sampled
    assert CTX_C in source._sampled and h.calls(CTX_C) == ["enable", "set_attributes"]
    source._schedule.on_launch_due(CTX_B)
    assert h.calls(CTX_B) == []


def test_context_destroy_and_module_unload_drain(make: Callable[..., Harness]) -> None:
    h = make()
    source = h.start()
    state = h.state()
    source._schedule.tick(state, T0)
    h.fake.pending = [Pc("k", 0x10, {0: 1})]
    data = SimpleNamespace(context=CTX_A, resource_descriptor=0)
    h.resource_handler(MODULE_UNLOAD_STARTING)(3, MODULE_UNLOAD_STARTING, data)
    assert h.calls()[-1] == "get_data"  # drained before the module goes
    (change,) = [e for e in h.emitter.events if isinstance(e, ResourceChange)]
    assert (change.operation, change.context_id, change.module_id) == ("module_unload", 11, 5)
    h.resource_handler(CONTEXT_DESTROY_STARTING)(3, CONTEXT_DESTROY_STARTING, data)
    assert h.calls()[-3:] == ["stop", "get_data", "disable"] and CTX_A not in source._sampled
    source._drains.decode_filled()
    assert [b.samples for b in h.batches()] == [[h.batches()[0].samples[0]]]


def test_a_wedged_call_stops_every_further_cupti_call(make: Callable[..., Harness]) -> None:
    h = make(watchdog_timeout=0.2)
    source = h.start()
    state = h.state()
    h.fake.hang["start"] = threading.Event()
    launcher = threading.Thread(target=source._schedule.tick, args=(state, T0))  # the hung launch thread
    launcher.start()
    assert _wait_for(lambda: bool(h.emitter.errors), seconds=0.45)
    assert h.emitter.errors[0][1].startswith("cuptiPCSamplingStart has not returned after")
    assert "PC sampling is disabled" in h.emitter.errors[0][1]
    h.fake.hang["start"].set()
    launcher.join(1.0)
    before = list(h.fake.calls)
    source._drains.drain(state)
    source._schedule.on_launch_due(CTX_A)
    h.resource_handler(CONTEXT_CREATED)(3, CONTEXT_CREATED, SimpleNamespace(context=CTX_C))
    h.stop()
    assert h.fake.calls == before  # no CUPTI call after the wedge, not even at stop
    assert len(h.emitter.errors) == 1


# --- behaviour the sources get wrong today (see the report that came with these tests) -----------


def test_a_failing_drain_at_stop_still_disables(make: Callable[..., Harness]) -> None:
    h = make()
    source = h.start()
    source._schedule.tick(h.state(), T0)
    h.fake.codes = [pcs.ERROR_INVALID_OPERATION]
    h.stop()
    assert h.emitter.errors[-1][1].startswith("disabling PC sampling")
    assert h.calls()[-1] == "disable"  # CUPTI must not keep writing into a buffer we are about to free


def test_detach_while_wedged_leaves_the_context_lock_free(make: Callable[..., Harness]) -> None:
    h = make(contexts=[CTX_A, CTX_C], watchdog_timeout=0.3)  # what stop() then waits on the lock
    source = h.start()
    state = h.state(CTX_C)
    source._watchdog.wedged.set()  # a call on CTX_A hung earlier
    h.resource_handler(CONTEXT_DESTROY_STARTING)(3, CONTEXT_DESTROY_STARTING, SimpleNamespace(context=CTX_C))
    assert not state.lock.locked()  # else stop() waits watchdog_timeout on it


class _LaunchOnRelease:
    """A context lock whose release lets a waiting launch thread in at once (an interleaving that
    happens when the application launches from another thread while stop() detaches)."""

    def __init__(self, then: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._then: Callable[[], None] | None = then

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()
        then, self._then = self._then, None
        if then is not None:
            then()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_launch_during_stop_does_not_reenable_a_detached_context(make: Callable[..., Harness]) -> None:
    h = make(control="launch", duty_cycle={"on": 1, "off": 4, "method": "enable_disable"})
    source = h.start()
    state = h.state()
    state.lock = _LaunchOnRelease(lambda: source._schedule.on_launch_due(CTX_A))
    h.stop()
    assert h.calls()[-1] == "disable", h.calls()


def test_under_a_budget_the_governor_sets_the_pause_from_what_each_window_cost(
    make: Callable[..., Harness],
) -> None:
    """The source tells its throttle what a window cost (control calls timed, plus the estimated
    kernel slowdown), and waits the pause it gets back; the decisions reach the emitter."""
    from cuptistream.events import GovernorDecision
    from cuptistream.overhead import HEADROOM, PC_SAMPLING_KERNEL_SLOWDOWN, Governor

    h = make()
    decisions: list[GovernorDecision] = []
    governor = Governor(0.01, decisions.append)
    h.source.use_governor(governor)
    source = h.start()
    throttle = source._windows.throttle
    assert throttle is not None and decisions and decisions[0].reason.startswith("first plan")
    state = h.state()
    assert T0 <= state.next_start <= T0 + throttle.plan.pause_s  # a random point of the first pause
    source._schedule.tick(state, state.next_start)  # Start
    opened = state.window_start
    window = throttle.plan.window_s
    assert state.window_end == opened + window
    source.stats["control_s"] = source.stats["decode_s"] = 0.0
    source._windows.charged_s = 0.0
    source.stats["control_s"] = 0.03  # what this window's control calls took (the fake CUPTI is instant)
    closed = opened + window
    pause = source._schedule.tick(state, closed) - closed  # Stop and drain: the window is measured
    unit = (0.03 + window * PC_SAMPLING_KERNEL_SLOWDOWN) / window
    assert throttle.windows == 1
    prior = pc_windows._PRIOR_UNIT_COST
    weight = 0.7 if unit > prior else 0.2  # the throttle's smoothing: quick to rise, slow to fall
    assert throttle.unit_cost == pytest.approx(prior + weight * (unit - prior), rel=0.05)
    assert pause == pytest.approx(throttle.plan.pause_s, rel=1e-6)
    assert pause == pytest.approx(throttle.unit_cost * window / (HEADROOM * 0.01) - window, rel=0.05)


def test_a_large_drain_is_split_into_events_that_fit_an_event_buffer_and_add_up(
    make: Callable[..., Harness],
) -> None:
    """A drain of thousands of PCs encodes to more than the probe's 1 MiB event buffer and, as one
    event, would be lost whole (probe/chunk_larger_than_slot): each event holds at most EVENT_PCS PCs."""
    from cuptistream.cupti.sampling_decode import PcData
    from cuptistream.events import PcSample
    from cuptistream.recording.codec import encode_chunk

    h = make()
    source = h.start()
    samples = [
        PcSample(
            cubin_crc=7, function_name="k" * 300, function_index=1, pc_offset=16 * i, stalls={"a": 2, "b": 1}
        )
        for i in range(450)
    ]
    data = PcData(
        range_id=0, total_samples=3 * 450 + 5, dropped_samples=4, non_user_samples=3, total_num_pcs=450,
        remaining_num_pcs=0, hardware_buffer_full=True, samples=samples,
    )  # fmt: skip
    source._drains.publish(h.state(), data, at_end=True)
    events = h.batches()
    assert len(events) >= 3 and all(len(e.samples) <= pc_drain.EVENT_PCS for e in events)
    assert [s for e in events for s in e.samples] == samples
    assert sum(e.total_samples for e in events) == data.total_samples
    assert events[0].total_samples == 3 * len(events[0].samples) + 5
    assert all(e.total_samples == 3 * len(e.samples) for e in events[1:])
    assert [e.dropped_samples for e in events] == [4] + [0] * (len(events) - 1)
    assert [e.non_user_samples for e in events] == [3] + [0] * (len(events) - 1)
    assert [e.hardware_buffer_full for e in events] == [True] + [False] * (len(events) - 1)
    assert max(len(encode_chunk([e]).payload) for e in events) < 64 * 1024  # the smallest event buffer
