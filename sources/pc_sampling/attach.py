"""The contexts PC sampling runs on: attach (Enable and every configuration attribute), one context
per GPU, an ``enable_disable`` window opened and closed, and detach (Stop, drain, Disable)."""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

from cuptistream.cupti import pcsampling_api as pcs
from cuptistream.cupti.contexts import context_ids
from cuptistream.cupti.watchdog import Watchdog
from cuptistream.errors import ConfigError
from cuptistream.plugin import Emitter

from .adapt import Adaptation
from .config import PcSamplingConfig, select_stall_reasons
from .context import SampledContext
from .drain import Drains, Filled
from .windows import Windows


class Contexts:
    """Attaches and detaches the sampled contexts; ``contexts`` maps each CUcontext to its state."""

    def __init__(
        self,
        config: PcSamplingConfig,
        contexts: dict[int, SampledContext],
        windows: Windows,
        adaptation: Adaptation,
        drains: Drains,
        emitter: Emitter,
        origin: str,
        watchdog: Watchdog,
        watched: Callable[..., Any],
        wake: threading.Event,
    ) -> None:
        self.config = config
        self.contexts = contexts
        self._windows = windows
        self._adaptation = adaptation
        self._drains = drains
        self.emitter = emitter
        self._origin = origin
        self._watchdog = watchdog
        self._watched = watched
        self._wake = wake
        self._device_owner: dict[int, int] = {}  # device id -> sampled ctx
        self._refused: set[int] = set()
        self._lock = threading.Lock()

    def attach(self, ctx: int) -> None:
        """Enable and configure PC sampling on ``ctx`` (callable from a resource callback)."""
        with self._lock:
            if ctx in self.contexts or ctx in self._refused or self._watchdog.wedged.is_set():
                return
            device_id, context_id = context_ids(ctx)
            owner = self._device_owner.get(device_id)
            if owner is not None:
                self._refused.add(ctx)
                self.emitter.report_error(
                    self._origin,
                    f"GPU {device_id} already has PC sampling on context {self.contexts[owner].context_id}; "
                    f"CUPTI samples one context per GPU, so context {context_id} is not sampled",
                    severity="warning",
                )
                return
            cfg = self.config
            try:
                self._watched("cuptiPCSamplingEnable", pcs.enable, ctx)
                stall_names = pcs.stall_reasons(ctx)
                selected = select_stall_reasons(cfg.stall_reasons, stall_names)
                state = SampledContext(
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
            windows = self._windows
            # Without start/stop control an enabled context samples: its first window is open.
            state.started = not windows.start_stop
            if state.started and windows.duty:
                windows.claim(ctx)  # opened by Enable: it overlaps a window open elsewhere, if any
            state.window_start = now
            state.window_end = now + windows.window_s() if windows.duty else float("inf")
            state.next_start = now + (windows.throttle.first_delay() if windows.throttle else 0.0)
            state.next_drain = now + self._adaptation.interval
            self.contexts[ctx] = state
            self._device_owner[device_id] = ctx
        self._wake.set()

    def _disable_quietly(self, ctx: int) -> None:
        with contextlib.suppress(pcs.CuptiError):
            pcs.disable(ctx)

    def _configure(self, state: SampledContext) -> None:
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
                    pcs.ATTR_ENABLE_START_STOP_CONTROL, enableStartStopControl=int(self._windows.start_stop)
                ),
                pcs.attribute(pcs.ATTR_OUTPUT_DATA_FORMAT, outputDataFormat=pcs.OUTPUT_DATA_FORMAT_PARSED),
                pcs.attribute(pcs.ATTR_SAMPLING_DATA_BUFFER, samplingDataBuffer=state.final.address),
            ],
        )

    def reenable_locked(self, state: SampledContext) -> None:
        """Open an enable_disable window: Enable and configure again."""
        self._drains.decode_filled()  # the last window's final buffer, before CUPTI may write it again
        self._watched("cuptiPCSamplingEnable", pcs.enable, state.ctx)
        state.enabled = True
        try:
            self._configure(state)
        except pcs.CuptiError:
            self.disable_locked(state)
            raise

    def disable_locked(self, state: SampledContext) -> None:
        """Drain, Disable, and emit what Disable leaves in the final buffer."""
        if not state.enabled:
            return
        try:
            self._drains.drain_locked(state)
        finally:  # Disable even when the drain failed: CUPTI must not keep writing our final buffer
            state.final.reset()
            state.enabled = False
            self._watched("cuptiPCSamplingDisable", pcs.disable, state.ctx)
            self._drains.hand_off(Filled(state, state.final, at_end=True))

    def detach(self, state: SampledContext) -> None:
        """Stop, drain and disable one context; what Disable leaves in the final buffer is emitted."""
        if self._watchdog.wedged.is_set() or not state.lock.acquire(
            timeout=float(self.config.watchdog_timeout)
        ):
            return
        try:
            # Forget the context first, under its lock: a launch action arriving meanwhile must
            # not find it and open a window again.
            with self._lock:
                self.contexts.pop(state.ctx, None)
                if self._device_owner.get(state.device_id) == state.ctx:
                    del self._device_owner[state.device_id]
            if self._watchdog.wedged.is_set():
                return
            if state.started and self._windows.start_stop:
                self._watched("cuptiPCSamplingStop", pcs.stop, state.ctx)
            state.started = False
            self.disable_locked(state)
        except pcs.CuptiError as error:
            self.emitter.report_error(self._origin, f"disabling PC sampling: {error}", result_code=error.code)
        finally:
            self._windows.release(state.ctx)
            state.lock.release()


def _mode(mode: str) -> int:
    return pcs.MODE_CONTINUOUS if mode == "continuous" else pcs.MODE_KERNEL_SERIALIZED
