"""Loss adaptation: after a loss, drain more often; once at the shortest drain interval, sample less
often (a longer sampling period). Each step is announced by a warning Error event."""

from __future__ import annotations

import time

from cuptistream.cupti import pcsampling_api as pcs
from cuptistream.plugin import Emitter

from .config import PcSamplingConfig
from .context import SampledContext


class Adaptation:
    """The drain interval all contexts use, and the steps that lengthen a context's sampling period."""

    def __init__(self, config: PcSamplingConfig, emitter: Emitter, origin: str) -> None:
        self.config = config
        self.emitter = emitter
        self._origin = origin
        self.interval = float(config.get_data_interval)  # seconds between drains of an open window
        self._last_adapt = 0.0

    def adapt(self, state: SampledContext, why: str) -> None:
        """Shorter drain interval first; once at the floor, a longer sampling period."""
        cfg = self.config
        now = time.monotonic()
        if not cfg.adapt or now - self._last_adapt < self.interval:
            return
        self._last_adapt = now
        if self.interval > cfg.min_get_data_interval:
            self.interval = max(float(cfg.min_get_data_interval), self.interval / 2)
            change = f"draining every {self.interval:.3g} s"
        elif state.wanted_period < cfg.max_sampling_period:
            # Applied by the next tick, on the thread that makes this source's CUPTI calls.
            state.wanted_period += 1
            change = f"sampling period to 2^{state.wanted_period} cycles"
        else:
            return
        self.emitter.report_error(self._origin, f"PC sampling adapts: {why}; {change}", severity="warning")

    def apply_period_locked(self, state: SampledContext) -> None:
        """Set the period ``adapt`` asked for (from a tick, under the context's lock)."""
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
