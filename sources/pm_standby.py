"""Standing by while another tool holds a device's counters: when to try Enable again, and what the
wait cost in samples.

The counters are freed by a person or a schedule (``dcgmi profile --resume`` ends a pause, an
Nsight session ends), not by us, so the waits grow from ``initial_backoff`` to ``max_backoff`` and
go on for as long as the program runs: a minute's lag at most after the counters free up, and one
cheap failed Enable a minute at most while they stay held.
"""

from __future__ import annotations

import time

from cuptistream.config import Duration, require_at_least, require_positive
from cuptistream.config.model import Strict


class CounterRetryConfig(Strict):
    """``pm_sampling.standby``: how the source tries again while another tool holds the counters."""

    enabled: bool = True  # false: one warning and the source ends, as with no permission
    initial_backoff: Duration = Duration(5.0)
    max_backoff: Duration = Duration(60.0)
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        require_positive("initial_backoff", self.initial_backoff)
        require_at_least("max_backoff", self.max_backoff, self.initial_backoff)
        require_at_least("multiplier", self.multiplier, 1)


class Standby:
    """One stretch of standing by: the waits between attempts, and how long it has lasted."""

    def __init__(self, config: CounterRetryConfig) -> None:
        self.config = config
        self.began = time.monotonic()
        self.attempts = 1  # the Enable that found the counters held
        self._next = float(config.initial_backoff)

    def next_wait(self) -> float:
        """Seconds until the next attempt (no jitter: one prober per device under a collector)."""
        wait = self._next
        self._next = min(self._next * self.config.multiplier, float(self.config.max_backoff))
        self.attempts += 1
        return wait

    def seconds(self) -> float:
        return time.monotonic() - self.began

    def missed(self, interval_s: float) -> int:
        """The samples the source would have taken meanwhile."""
        return int(self.seconds() / interval_s)

    def schedule(self) -> str:
        """The waits, for the warning: "every 5s, doubling to 60s"."""
        first, most = float(self.config.initial_backoff), float(self.config.max_backoff)
        if first == most or self.config.multiplier == 1:
            return f"every {first:g}s"
        growing = "doubling" if self.config.multiplier == 2 else f"growing x{self.config.multiplier:g}"
        return f"after {first:g}s, {growing} to {most:g}s"
