"""The duty-cycle schedule: the worker thread's loop, and each context's tick (open a window, drain it,
close it). Ticks run on the worker, or with ``control: launch`` at the exit of the application's next
kernel launch once one is due (``cuptistream.cupti.launch_hook``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from cuptistream.cupti import pcsampling_api as pcs
from cuptistream.cupti.cubin_archive import CubinArchive
from cuptistream.cupti.launch_hook import LaunchHook
from cuptistream.cupti.watchdog import Watchdog
from cuptistream.overhead import CLAIM_RETRY_S
from cuptistream.plugin import Emitter

from .adapt import Adaptation
from .attach import Contexts
from .context import SampledContext
from .drain import Drains
from .windows import Windows


class Schedule:
    """When each context's window opens and closes and when it drains; the worker thread runs it."""

    def __init__(
        self,
        contexts: Contexts,
        windows: Windows,
        adaptation: Adaptation,
        drains: Drains,
        cubins: CubinArchive,
        stats: dict[str, float],
        emitter: Emitter,
        origin: str,
        watchdog: Watchdog,
        watched: Callable[..., Any],
        stopping: threading.Event,
        wake: threading.Event,
    ) -> None:
        self._attached = contexts
        self._contexts = contexts.contexts
        self._windows = windows
        self._adaptation = adaptation
        self._drains = drains
        self._cubins = cubins
        self.stats = stats
        self.emitter = emitter
        self._origin = origin
        self._watchdog = watchdog
        self._watched = watched
        self._stopping = stopping
        self._wake = wake
        self.hook: LaunchHook | None = None  # control: launch

    def control_from_launches(self) -> None:
        """``control: launch``: from our own thread, cuptiPCSamplingStart hung the launch path under
        PyTorch, so the calls run on the application's thread, at the exit of its next launch."""
        self.hook = LaunchHook(self.on_launch_due)

    def run(self) -> None:
        """The worker thread."""
        try:
            self._schedule()
        except Exception as error:  # never die silently: say so, and leave the contexts to stop()
            self.emitter.report_error(
                self._origin, f"PC sampling schedule stopped: {type(error).__name__}: {error}"
            )

    def _schedule(self) -> None:
        while not self._stopping.is_set() and not self._watchdog.wedged.is_set():
            now = time.monotonic()
            if self.hook is None:
                wake_at = min((self.tick_reporting(state, now) for state in list(self._contexts.values())),
                              default=now + 1.0)  # fmt: skip
            else:
                wake_at = min((self._next_due(state) for state in list(self._contexts.values())),
                              default=now + 1.0)  # fmt: skip
                if wake_at <= now:
                    self.hook.arm()  # the next launch runs on_launch_due, then wakes us
                    wake_at = now + 1.0
                else:
                    self.hook.disarm()
            self._drains.decode_filled()
            self._cubins.write()
            self._wake.wait(max(0.0, min(wake_at, now + 1.0) - time.monotonic()))
            self._wake.clear()

    def on_launch_due(self, ctx: int) -> None:
        """The launch hook's action, on the application's thread: whatever is due on ``ctx``."""
        if self._stopping.is_set():
            return  # stop() detaches every context itself
        began = time.perf_counter()
        state = self._contexts.get(ctx)
        if state is not None and not self._watchdog.wedged.is_set():
            self.tick_reporting(state, time.monotonic())
        self._wake.set()
        self.stats["launch_actions"] += 1
        self.stats["launch_action_s"] += time.perf_counter() - began

    def tick_reporting(self, state: SampledContext, now: float) -> float:
        try:
            return self.tick(state, now)
        except pcs.CuptiError as error:
            self.emitter.report_error(self._origin, str(error), result_code=error.code)
            return now + max(self._adaptation.interval, 1.0)

    def _next_due(self, state: SampledContext) -> float:
        if not state.started:
            return state.next_start
        if not self._windows.duty:
            return state.next_drain
        return min(state.next_drain, state.window_end)

    def tick(self, state: SampledContext, now: float) -> float:
        """Advance one context's duty cycle; return when it next needs attention."""
        began = time.perf_counter()
        try:
            return self._tick_locked(state, now)
        finally:  # what the program pays for control, whichever thread this ran on
            self.stats["control_s"] += time.perf_counter() - began

    def _tick_locked(self, state: SampledContext, now: float) -> float:
        windows = self._windows
        with state.lock:
            if state.ctx not in self._contexts:
                return now + 1.0
            self._adaptation.apply_period_locked(state)
            if not state.started and now >= state.next_start:
                if not windows.claim(state.ctx):  # another source's window is open: ask again soon
                    state.next_start = now + CLAIM_RETRY_S
                    return self._next_due(state)
                if windows.start_stop:
                    self._watched("cuptiPCSamplingStart", pcs.start, state.ctx)
                else:
                    self._attached.reenable_locked(state)
                state.started = True
                state.window_start = now
                state.window_end = now + windows.window_s()
                state.next_drain = now + self._adaptation.interval
            elif state.started and windows.duty and now >= state.window_end:
                state.started = False
                if windows.start_stop:
                    self._watched("cuptiPCSamplingStop", pcs.stop, state.ctx)
                    self._drains.drain_locked(state)
                else:
                    self._attached.disable_locked(state)
                windows.release(state.ctx)
                state.next_start = now + windows.window_closed(now - state.window_start)
            elif state.started and now >= state.next_drain:
                self._drains.drain_locked(state)
                state.next_drain = now + self._adaptation.interval
            return self._next_due(state)
