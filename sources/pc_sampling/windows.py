"""The window plan: whether windows open and close at all, how, how long each stays open and the
pause after it: the configured duty cycle, or under ``overhead.budget`` the governor's."""

from __future__ import annotations

from collections.abc import Callable

from cuptistream.overhead import PC_SAMPLING_KERNEL_SLOWDOWN, Governor, Throttle, WindowCost

from .config import PcSamplingConfig

# Under a budget: the pause past which windows get shorter, the shortest window, and the cost per second of
# open window assumed until one is measured (a torch MLP's, measured on an H100: a calibration).
_MAX_PAUSE_S = 600.0
_MIN_WINDOW_S = 0.05
_PRIOR_UNIT_COST = 0.85


class Windows:
    """The duty cycle's windows, governed when the session has a governor and windows close."""

    def __init__(
        self,
        config: PcSamplingConfig,
        governor: Governor | None,
        name: str,
        stats: dict[str, float],
        timestamp: Callable[[], int],
    ) -> None:
        self.config = config
        self.stats = stats  # read for what a window cost; "windows" counted here
        self.throttle: Throttle | None = None
        self.charged_s = 0.0  # control + decode seconds already charged to a window
        self._claimed: set[int] = set()  # contexts whose open window holds the governor's slot
        if governor is not None and self.duty:
            # The configured window is the longest the governor uses; the pause is its to set.
            self.throttle = Throttle(
                governor,
                name,
                window_s=float(config.duty_cycle.on), pause_s=float(config.duty_cycle.off),
                min_window_s=_MIN_WINDOW_S, max_pause_s=_MAX_PAUSE_S, prior_unit_cost=_PRIOR_UNIT_COST,
                timestamp=timestamp,
            )  # fmt: skip
            self.throttle.first()

    @property
    def duty(self) -> bool:
        """Windows open and close (``duty_cycle.off > 0``); else sampling runs all the time."""
        return self.config.duty_cycle.off > 0

    @property
    def start_stop(self) -> bool:
        """Windows open and close with Start/Stop on an enabled context (not Enable/Disable)."""
        return self.duty and self.config.duty_cycle.method == "start_stop"

    def claim(self, ctx: int) -> bool:
        """Before ``ctx``'s window opens: False while another source's window is open (``Governor.claim``)."""
        if self.throttle is None or ctx in self._claimed:
            return True
        if not self.throttle.governor.claim(self.throttle.source):
            return False
        self._claimed.add(ctx)
        return True

    def release(self, ctx: int) -> None:
        """After ``ctx``'s window closed (or its context went)."""
        if ctx in self._claimed and self.throttle is not None:
            self._claimed.discard(ctx)
            self.throttle.governor.release(self.throttle.source)

    def window_s(self) -> float:
        return self.throttle.plan.window_s if self.throttle else float(self.config.duty_cycle.on)

    def window_closed(self, open_s: float) -> float:
        """The pause before the next window: the configured one, or the governor's, told what this
        window cost (control calls and decoding since the last window closed, and the estimated
        slowdown of the sampled kernels)."""
        self.stats["windows"] += 1
        if self.throttle is None:
            return float(self.config.duty_cycle.off)
        spent = self.stats["control_s"] + self.stats["decode_s"]
        host, self.charged_s = spent - self.charged_s, spent
        cost = WindowCost(open_s=open_s, host_s=host, gpu_s=open_s * PC_SAMPLING_KERNEL_SLOWDOWN)
        return self.throttle.window_done(cost).pause_s
