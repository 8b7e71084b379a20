"""PC sampling source (type ``pc_sampling``): continuous, duty-cycled, per CUDA context.

Collects with CUPTI's PC Sampling API (``cupti_pcsampling.h``, guide §2.10) and emits
``PcSampleBatch`` events: per PC, the cubin CRC, function, pc offset and named stall-reason counts.

How it runs:
- Each CUDA context (found at start, or created later: resource callback) is enabled once. With a
  duty cycle (``duty_cycle.off > 0``) start/stop control is on: an ``on`` window opens with
  ``cuptiPCSamplingStart``, closes after ``duty_cycle.on`` with ``cuptiPCSamplingStop`` and a drain
  (``cuptiPCSamplingGetData``), and the next opens ``duty_cycle.off`` later. ``duty_cycle.off: 0``
  samples from Enable on, all the time, draining every ``get_data_interval``.
- A worker thread keeps the schedule. With ``control: launch`` (the default) the calls themselves
  run on the application's thread at the exit of its next kernel launch once one is due
  (``cuptistream.cupti.launch_hook``): from our own thread, ``cuptiPCSamplingStart`` hung the launch
  path under PyTorch. ``control: worker`` makes them from the worker thread, which suits programs
  that launch from one thread and go idle.
- Drains also happen on every module unload (continuous mode needs it, guide §2.10.4), when a
  context is destroyed, and at stop (``cuptiPCSamplingDisable`` writes the rest to the buffer we gave).
- A drain only makes the C calls: GetData fills one of a few pooled buffers, which the worker
  decodes and emits. Decoding thousands of PCs inside a launch held the application's thread for up
  to 1 s per 20 s under torch; when every buffer still waits, the drain decodes one itself (bounded
  memory before speed).
- Losses are reported, never silent: hardware-dropped samples, a full hardware buffer
  (``CUPTI_ERROR_OUT_OF_MEMORY``), PCs left uncollected. On a loss the source adapts: first a shorter
  drain interval, then a longer sampling period (each step announced by a warning Error event).
- CUPTI samples one context per GPU (guide §2.10.7): a second context on the same GPU gets a
  warning event and is not sampled.
- A CUPTI call that does not return within ``watchdog_timeout`` disables the source with an Error
  event (``cuptistream.cupti.watchdog``).

Defaults come from the H200 measurements in ``docs/gpu-validation.md`` and ``docs/benchmarks.md``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cuptistream.cupti import pcsampling_api as pcs
from cuptistream.cupti import sampling_pair
from cuptistream.cupti.contexts import (
    CONTEXT_CREATED,
    CONTEXT_DESTROY_STARTING,
    MODULE_LOADED,
    MODULE_UNLOAD_STARTING,
    active_primary_contexts,
    context_ids,
    current_context,
    module_data,
)
from cuptistream.cupti.cubin_archive import CubinArchive
from cuptistream.cupti.launch_hook import LaunchHook
from cuptistream.cupti.sampling_decode import LiveMemory, PcData, decode_pc_data
from cuptistream.errors import ConfigError
from cuptistream.events import PcSample, PcSampleBatch, ResourceChange
from cuptistream.probe.governor import PC_SAMPLING_KERNEL_SLOWDOWN, Governor, Throttle, WindowCost

from .cupti_worker import CuptiWorkerSource
from .pc_sampling_config import PcSamplingConfig, select_stall_reasons

STAGE = "pc_sampling"
EVENT_PCS = 200  # at most this many PCs per pc_samples event (see _publish) ...
EVENT_BYTES = 48 * 1024  # ... and about this many bytes, under the smallest event buffer (64 KiB)


@dataclass
class _Context:
    """One sampled CUDA context."""

    ctx: int
    device_id: int
    context_id: int
    stall_names: dict[int, str]
    final: pcs.SamplingBuffer  # given to CUPTI as SAMPLING_DATA_BUFFER; Disable fills it
    buffer_shape: tuple[int, int]  # (PCs, stall reasons) per GetData buffer
    period: int
    wanted_period: int  # _adapt asks, the next tick sets it
    stall_indexes: Any  # ctypes uint32 array of the selected reasons, kept alive for CUPTI
    lock: threading.Lock = field(default_factory=threading.Lock)
    spare: list[pcs.SamplingBuffer] = field(default_factory=list)  # GetData buffers not in use
    buffers: int = 0  # GetData buffers allocated (at most _BUFFERS_PER_CONTEXT)
    enabled: bool = True
    started: bool = False
    window_start: float = 0.0
    window_end: float = 0.0
    next_start: float = 0.0
    next_drain: float = 0.0


@dataclass
class _Filled:
    """A buffer CUPTI filled (GetData, or Disable's final buffer), waiting to be decoded."""

    state: _Context
    buffer: pcs.SamplingBuffer
    at_end: bool = False


# GetData buffers per context: one being filled while up to three wait for the worker to decode.
# Each holds collect_pcs x (PC record + stall reasons), about 1.5 MB at the defaults.
_BUFFERS_PER_CONTEXT = 4

# Under a budget: the longest pause between windows, the shortest window, and the cost per second of
# open window assumed until one is measured (H100, torch MLP: docs/benchmarks.md).
_MAX_PAUSE_S = 600.0
_MIN_WINDOW_S = 0.05
_PRIOR_UNIT_COST = 0.85


class PcSamplingSource(CuptiWorkerSource):
    config_type = PcSamplingConfig
    config: PcSamplingConfig
    label = "PC sampling"
    _governor: Governor | None = None

    def use_governor(self, governor: Governor) -> None:
        self._governor = governor

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        from cuptistream.cupti import driver

        driver.require_gpu()
        sampling_pair.claim("pc_sampling", self.name)
        try:
            self._start()
        except BaseException:
            sampling_pair.release("pc_sampling", self.name)
            raise

    def _start(self) -> None:
        self._contexts: dict[int, _Context] = {}
        self._device_owner: dict[int, int] = {}  # device id -> sampled ctx
        self._refused: set[int] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._interval = float(self.config.get_data_interval)
        self._last_adapt = 0.0
        self._names: dict[int, str] = {}  # function-name cache by pointer
        self._cubins = CubinArchive(self.config.cubin_dir)
        self._filled: collections.deque[_Filled] = collections.deque()  # GetData/Disable output to decode
        self._decode_lock = threading.Lock()
        # Counters, and seconds spent in GetData and in decoding (what the bench reads to see the cost).
        self.stats: dict[str, float] = {
            "batches": 0, "samples": 0, "dropped": 0, "pcs": 0, "get_data_calls": 0,
            "get_data_s": 0.0, "decode_s": 0.0, "launch_actions": 0, "launch_action_s": 0.0,
            "function_names": 0, "control_s": 0.0, "windows": 0,
        }  # fmt: skip
        self._throttle: Throttle | None = None
        self._charged_s = 0.0  # control + decode seconds already charged to a window
        if self._governor is not None and self._duty:
            # The configured window is the longest the governor uses; the pause is its to set.
            self._throttle = Throttle(
                self._governor,
                self.name,
                window_s=float(self.config.duty_cycle.on), pause_s=float(self.config.duty_cycle.off),
                min_window_s=_MIN_WINDOW_S, max_pause_s=_MAX_PAUSE_S, prior_unit_cost=_PRIOR_UNIT_COST,
                timestamp=self._now,
            )  # fmt: skip
            self._throttle.first()
        self._hold_cupti(float(self.config.watchdog_timeout))
        self._hook: LaunchHook | None = None
        try:
            if self.config.control == "launch":
                self._hook = LaunchHook(self._on_launch_due)
            self._register_resource_callbacks(
                [
                    (CONTEXT_CREATED, self._on_context_created),
                    (CONTEXT_DESTROY_STARTING, self._on_context_destroy),
                    (MODULE_LOADED, self._on_module_loaded),
                    (MODULE_UNLOAD_STARTING, self._on_module_unload),
                ]
            )
            for ctx in {current_context(), *active_primary_contexts()} - {0}:
                self._attach(ctx)
        except BaseException:
            self._release()
            raise
        self._start_worker(self._run)

    def flush(self) -> None:
        for state in list(self._contexts.values()):
            self._drain(state)
        self._decode_filled()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=float(self.config.watchdog_timeout))
        if self._hook is not None:
            self._hook.disarm()
        for state in list(self._contexts.values()):
            self._detach(state)
        self._decode_filled()
        self._cubins.write()
        self._release()
        sampling_pair.release("pc_sampling", self.name)

    def _release(self) -> None:
        if self._hook is not None:
            self._hook.disarm()
        super()._release()

    # --- contexts -----------------------------------------------------------------------------

    def _attach(self, ctx: int) -> None:
        """Enable and configure PC sampling on ``ctx`` (callable from a resource callback)."""
        with self._lock:
            if ctx in self._contexts or ctx in self._refused or self._watchdog.wedged.is_set():
                return
            device_id, context_id = context_ids(ctx)
            owner = self._device_owner.get(device_id)
            if owner is not None:
                self._refused.add(ctx)
                self.emitter.report_error(
                    self._origin,
                    f"GPU {device_id} already has PC sampling on context {self._contexts[owner].context_id}; "
                    f"CUPTI samples one context per GPU, so context {context_id} is not sampled",
                    severity="warning",
                )
                return
            cfg = self.config
            try:
                self._watched("cuptiPCSamplingEnable", pcs.enable, ctx)
                stall_names = pcs.stall_reasons(ctx)
                selected = select_stall_reasons(cfg.stall_reasons, stall_names)
                state = _Context(
                    ctx, device_id, context_id, stall_names,
                    final=pcs.SamplingBuffer(cfg.collect_pcs, len(selected)),
                    buffer_shape=(cfg.collect_pcs, len(selected)),
                    period=cfg.sampling_period,
                    wanted_period=cfg.sampling_period,
                    stall_indexes=(ctypes.c_uint32 * len(selected))(*selected),
                )  # fmt: skip
                self._configure(state)
            except ConfigError:
                self._disable_quietly(ctx)
                raise
            except pcs.CuptiError as error:
                self._disable_quietly(ctx)
                self._refused.add(ctx)
                self.emitter.report_error(
                    self._origin,
                    f"PC sampling cannot run on context {context_id}: {error}",
                    result_code=error.code,
                )
                return
            now = time.monotonic()
            # Without start/stop control an enabled context samples: its first window is open.
            state.started = not self._start_stop
            state.window_start = now
            state.window_end = now + self._window_s() if self._duty else float("inf")
            state.next_start = now + (self._throttle.first_delay() if self._throttle else 0.0)
            state.next_drain = now + self._interval
            self._contexts[ctx] = state
            self._device_owner[device_id] = ctx
        self._wake.set()

    def _disable_quietly(self, ctx: int) -> None:
        with contextlib.suppress(pcs.CuptiError):
            pcs.disable(ctx)

    @property
    def _duty(self) -> bool:
        return self.config.duty_cycle.off > 0

    @property
    def _start_stop(self) -> bool:
        return self._duty and self.config.duty_cycle.method == "start_stop"

    def _configure(self, state: _Context) -> None:
        """Every configuration attribute, on an enabled context (after each Enable)."""
        cfg = self.config
        pcs.set_attributes(
            state.ctx,
            [
                pcs.attribute(pcs.ATTR_COLLECTION_MODE, collectionMode=_mode(cfg.mode)),
                pcs.attribute(pcs.ATTR_SAMPLING_PERIOD, samplingPeriod=state.period),
                pcs.attribute(
                    pcs.ATTR_STALL_REASON,
                    stallReasonData=pcs._StallReasonData(len(state.stall_indexes), state.stall_indexes),
                ),
                pcs.attribute(pcs.ATTR_SCRATCH_BUFFER_SIZE, scratchBufferSize=int(cfg.scratch_buffer_size)),
                pcs.attribute(
                    pcs.ATTR_HARDWARE_BUFFER_SIZE, hardwareBufferSize=int(cfg.hardware_buffer_size)
                ),
                pcs.attribute(
                    pcs.ATTR_WORKER_THREAD_PERIODIC_SLEEP_SPAN,
                    workerThreadPeriodicSleepSpan=max(1, round(cfg.worker_sleep_span * 1000)),
                ),
                pcs.attribute(
                    pcs.ATTR_ENABLE_START_STOP_CONTROL, enableStartStopControl=int(self._start_stop)
                ),
                pcs.attribute(pcs.ATTR_OUTPUT_DATA_FORMAT, outputDataFormat=pcs.OUTPUT_DATA_FORMAT_PARSED),
                pcs.attribute(pcs.ATTR_SAMPLING_DATA_BUFFER, samplingDataBuffer=state.final.address),
            ],
        )

    def _reenable_locked(self, state: _Context) -> None:
        """Open an enable_disable window: Enable and configure again."""
        self._decode_filled()  # the last window's final buffer, before CUPTI may write it again
        self._watched("cuptiPCSamplingEnable", pcs.enable, state.ctx)
        state.enabled = True
        try:
            self._configure(state)
        except pcs.CuptiError:
            self._disable_locked(state)
            raise

    def _disable_locked(self, state: _Context) -> None:
        """Drain, Disable, and emit what Disable leaves in the final buffer."""
        if not state.enabled:
            return
        try:
            self._drain_locked(state)
        finally:  # Disable even when the drain failed: CUPTI must not keep writing our final buffer
            state.final.reset()
            state.enabled = False
            self._watched("cuptiPCSamplingDisable", pcs.disable, state.ctx)
            self._hand_off(_Filled(state, state.final, at_end=True))

    def _detach(self, state: _Context) -> None:
        """Stop, drain and disable one context; what Disable leaves in the final buffer is emitted."""
        if self._watchdog.wedged.is_set() or not state.lock.acquire(
            timeout=float(self.config.watchdog_timeout)
        ):
            return
        try:
            # Forget the context first, under its lock: a launch action arriving meanwhile must
            # not find it and open a window again.
            with self._lock:
                self._contexts.pop(state.ctx, None)
                if self._device_owner.get(state.device_id) == state.ctx:
                    del self._device_owner[state.device_id]
            if self._watchdog.wedged.is_set():
                return
            if state.started and self._start_stop:
                self._watched("cuptiPCSamplingStop", pcs.stop, state.ctx)
            state.started = False
            self._disable_locked(state)
        except pcs.CuptiError as error:
            self.emitter.report_error(self._origin, f"disabling PC sampling: {error}", result_code=error.code)
        finally:
            state.lock.release()

    # --- resource callbacks (application thread, inside the CUDA call) -------------------------

    def _on_context_created(self, domain: int, cbid: int, data: Any) -> None:
        if not self._stopping.is_set():
            self._attach(int(data.context))

    def _on_context_destroy(self, domain: int, cbid: int, data: Any) -> None:
        state = self._contexts.get(int(data.context))
        if state is not None:
            self._detach(state)

    def _on_module_loaded(self, domain: int, cbid: int, data: Any) -> None:
        self._module_event("module_load", data)

    def _on_module_unload(self, domain: int, cbid: int, data: Any) -> None:
        # Continuous mode: drain before the module goes, so no PC is attributed to a later module
        # loaded at the same address (guide §2.10.4).
        state = self._contexts.get(int(data.context))
        if state is not None:
            self._drain(state)
        self._module_event("module_unload", data)

    def _module_event(self, operation: str, data: Any) -> None:
        module_id, size, cubin = module_data(int(data.resource_descriptor))
        crc = 0
        if cubin and size:
            try:
                crc = pcs.cubin_crc_at(cubin, size)
            except pcs.CuptiError as error:
                self.emitter.report_error(self._origin, f"cubin CRC: {error}", severity="warning")
            self._cubins.keep(crc, cubin, size)
        state = self._contexts.get(int(data.context))
        self.emitter.emit(
            [
                ResourceChange(
                    operation=operation,
                    timestamp=self._now(),
                    device_id=state.device_id if state else 0,
                    context_id=state.context_id if state else 0,
                    module_id=module_id,
                    cubin_crc=crc,
                    cubin_size=size,
                )
            ]
        )

    # --- the worker: duty cycle and periodic drains -------------------------------------------

    def _run(self) -> None:
        try:
            self._schedule()
        except Exception as error:  # never die silently: say so, and leave the contexts to stop()
            self.emitter.report_error(
                self._origin, f"PC sampling schedule stopped: {type(error).__name__}: {error}"
            )

    def _schedule(self) -> None:
        while not self._stopping.is_set() and not self._watchdog.wedged.is_set():
            now = time.monotonic()
            if self._hook is None:
                wake_at = min((self._tick_reporting(state, now) for state in list(self._contexts.values())),
                              default=now + 1.0)  # fmt: skip
            else:
                wake_at = min((self._next_due(state) for state in list(self._contexts.values())),
                              default=now + 1.0)  # fmt: skip
                if wake_at <= now:
                    self._hook.arm()  # the next launch runs _on_launch_due, then wakes us
                    wake_at = now + 1.0
                else:
                    self._hook.disarm()
            self._decode_filled()
            self._cubins.write()
            self._wake.wait(max(0.0, min(wake_at, now + 1.0) - time.monotonic()))
            self._wake.clear()

    def _on_launch_due(self, ctx: int) -> None:
        """The launch hook's action, on the application's thread: whatever is due on ``ctx``."""
        if self._stopping.is_set():
            return  # stop() detaches every context itself
        began = time.perf_counter()
        state = self._contexts.get(ctx)
        if state is not None and not self._watchdog.wedged.is_set():
            self._tick_reporting(state, time.monotonic())
        self._wake.set()
        self.stats["launch_actions"] += 1
        self.stats["launch_action_s"] += time.perf_counter() - began

    def _tick_reporting(self, state: _Context, now: float) -> float:
        try:
            return self._tick(state, now)
        except pcs.CuptiError as error:
            self.emitter.report_error(self._origin, str(error), result_code=error.code)
            return now + max(self._interval, 1.0)

    def _next_due(self, state: _Context) -> float:
        if not state.started:
            return state.next_start
        if not self._duty:
            return state.next_drain
        return min(state.next_drain, state.window_end)

    def _tick(self, state: _Context, now: float) -> float:
        """Advance one context's duty cycle; return when it next needs attention."""
        began = time.perf_counter()
        try:
            return self._tick_locked(state, now)
        finally:  # what the program pays for control, whichever thread this ran on
            self.stats["control_s"] += time.perf_counter() - began

    def _tick_locked(self, state: _Context, now: float) -> float:
        with state.lock:
            if state.ctx not in self._contexts:
                return now + 1.0
            self._apply_period_locked(state)
            if not state.started and now >= state.next_start:
                if self._start_stop:
                    self._watched("cuptiPCSamplingStart", pcs.start, state.ctx)
                else:
                    self._reenable_locked(state)
                state.started = True
                state.window_start = now
                state.window_end = now + self._window_s()
                state.next_drain = now + self._interval
            elif state.started and self._duty and now >= state.window_end:
                state.started = False
                if self._start_stop:
                    self._watched("cuptiPCSamplingStop", pcs.stop, state.ctx)
                    self._drain_locked(state)
                else:
                    self._disable_locked(state)
                state.next_start = now + self._window_closed(now - state.window_start)
            elif state.started and now >= state.next_drain:
                self._drain_locked(state)
                state.next_drain = now + self._interval
            return self._next_due(state)

    def _window_s(self) -> float:
        return self._throttle.plan.window_s if self._throttle else float(self.config.duty_cycle.on)

    def _window_closed(self, open_s: float) -> float:
        """The pause before the next window: the configured one, or the governor's, told what this
        window cost (control calls and decoding since the last window closed, and the estimated
        slowdown of the sampled kernels)."""
        self.stats["windows"] += 1
        if self._throttle is None:
            return float(self.config.duty_cycle.off)
        spent = self.stats["control_s"] + self.stats["decode_s"]
        host, self._charged_s = spent - self._charged_s, spent
        cost = WindowCost(open_s=open_s, host_s=host, gpu_s=open_s * PC_SAMPLING_KERNEL_SLOWDOWN)
        return self._throttle.window_done(cost).pause_s

    def _drain(self, state: _Context) -> None:
        if self._watchdog.wedged.is_set():
            return
        with state.lock:
            if state.ctx in self._contexts and state.enabled:
                self._drain_locked(state)

    def _drain_locked(self, state: _Context) -> None:
        """GetData until CUPTI has no more PCs for us (bounded). Only the C calls run here, on
        whichever thread drains (often the application's, inside a launch); the worker decodes."""
        for _ in range(64):
            buffer = self._take_buffer(state)
            buffer.reset()
            began = time.perf_counter()
            code = self._watched("cuptiPCSamplingGetData", pcs.get_data, state.ctx, buffer.data)
            self.stats["get_data_calls"] += 1
            self.stats["get_data_s"] += time.perf_counter() - began
            if code != pcs.SUCCESS:
                state.spare.append(buffer)
                if code != pcs.ERROR_OUT_OF_MEMORY:
                    raise pcs.CuptiError("cuptiPCSamplingGetData", code, pcs.result_string(code))
                self.emitter.report_loss(STAGE, "hardware_buffer_full", 1, unit="buffers")
                self._adapt(state, "the hardware buffer filled")
                return
            remaining, total = int(buffer.data.remainingNumPcs), int(buffer.data.totalNumPcs)
            self._hand_off(_Filled(state, buffer))
            if not remaining or not total:
                return
        self._adapt(state, f"{remaining} PCs were still waiting after 64 drains")

    def _take_buffer(self, state: _Context) -> pcs.SamplingBuffer:
        """A free GetData buffer; if all are waiting to be decoded, decode them here (back-pressure)."""
        if not state.spare and state.buffers >= _BUFFERS_PER_CONTEXT:
            self._decode_filled()
        if state.spare:
            return state.spare.pop()
        state.buffers += 1
        return pcs.SamplingBuffer(*state.buffer_shape)

    def _hand_off(self, filled: _Filled) -> None:
        self._filled.append(filled)
        self._wake.set()

    def _decode_filled(self) -> None:
        """Decode and emit every filled buffer, in order, and return GetData buffers to their pool."""
        with self._decode_lock:
            while self._filled:
                filled = self._filled.popleft()
                began = time.perf_counter()
                state = filled.state
                data = decode_pc_data(LiveMemory(), filled.buffer.address, state.stall_names, self._names)
                if filled.buffer is not state.final:
                    state.spare.append(filled.buffer)
                self._publish(state, data, at_end=filled.at_end)
                self.stats["pcs"] += data.total_num_pcs
                self.stats["function_names"] = len(self._names)
                self.stats["decode_s"] += time.perf_counter() - began

    def _publish(self, state: _Context, data: PcData, at_end: bool = False) -> None:
        if data.samples or data.total_samples or data.dropped_samples:
            # One event per EVENT_PCS PCs: a drain of thousands of PCs encodes to megabytes, more
            # than one event buffer to the collector holds. Each event's total_samples is its PCs'
            # samples; the first also carries what CUPTI counted beyond them, so the totals add up.
            timestamp = self._now()
            pieces = _pieces(data.samples) or [[]]
            in_pcs = [sum(sum(sample.stalls.values()) for sample in piece) for piece in pieces]
            beyond = data.total_samples - sum(in_pcs)
            self.emitter.emit(
                [
                    PcSampleBatch(
                        timestamp=timestamp,
                        device_id=state.device_id,
                        context_id=state.context_id,
                        range_id=data.range_id,
                        samples=piece,
                        total_samples=samples + (beyond if first else 0),
                        non_user_samples=data.non_user_samples if first else 0,
                        dropped_samples=data.dropped_samples if first else 0,
                        hardware_buffer_full=data.hardware_buffer_full and first,
                        sampling_period=state.period,
                    )
                    for first, piece, samples in zip(
                        [True] + [False] * (len(pieces) - 1), pieces, in_pcs, strict=True
                    )
                ]
            )
            self.stats["batches"] += 1
            self.stats["samples"] += data.total_samples
        lost = False
        if data.dropped_samples:
            self.stats["dropped"] += data.dropped_samples
            self.emitter.report_loss(STAGE, "hardware_dropped", data.dropped_samples, unit="samples")
            lost = True
        if data.hardware_buffer_full:
            self.emitter.report_loss(STAGE, "hardware_buffer_full", 1, unit="buffers")
            lost = True
        if at_end and data.remaining_num_pcs:
            self.emitter.report_loss(STAGE, "not_collected_at_disable", data.remaining_num_pcs, unit="pcs")
        if lost and not at_end:
            self._adapt(state, "samples were lost")

    def _adapt(self, state: _Context, why: str) -> None:
        """Shorter drain interval first; once at the floor, a longer sampling period."""
        cfg = self.config
        now = time.monotonic()
        if not cfg.adapt or now - self._last_adapt < self._interval:
            return
        self._last_adapt = now
        if self._interval > cfg.min_get_data_interval:
            self._interval = max(float(cfg.min_get_data_interval), self._interval / 2)
            change = f"draining every {self._interval:.3g} s"
        elif state.wanted_period < cfg.max_sampling_period:
            # Applied by the next tick, on the thread that makes this source's CUPTI calls.
            state.wanted_period += 1
            change = f"sampling period to 2^{state.wanted_period} cycles"
        else:
            return
        self.emitter.report_error(self._origin, f"PC sampling adapts: {why}; {change}", severity="warning")

    def _apply_period_locked(self, state: _Context) -> None:
        if state.wanted_period == state.period or not state.enabled:
            return
        try:
            pcs.set_attributes(
                state.ctx, [pcs.attribute(pcs.ATTR_SAMPLING_PERIOD, samplingPeriod=state.wanted_period)]
            )
        except pcs.CuptiError as error:
            state.wanted_period = state.period
            self.emitter.report_error(
                self._origin, f"could not lengthen the sampling period: {error}", severity="warning"
            )
        else:
            state.period = state.wanted_period


def _pieces(samples: list[PcSample]) -> list[list[PcSample]]:
    """``samples`` cut into runs of at most EVENT_PCS PCs and about EVENT_BYTES encoded bytes."""
    pieces: list[list[PcSample]] = []
    piece: list[PcSample] = []
    size = 0
    for sample in samples:
        cost = 48 + len(sample.function_name) + 24 * len(sample.stalls)  # msgpack, roughly, from above
        if piece and (len(piece) >= EVENT_PCS or size + cost > EVENT_BYTES):
            pieces.append(piece)
            piece, size = [], 0
        piece.append(sample)
        size += cost
    if piece:
        pieces.append(piece)
    return pieces


def _mode(mode: str) -> int:
    return pcs.MODE_CONTINUOUS if mode == "continuous" else pcs.MODE_KERNEL_SERIALIZED
