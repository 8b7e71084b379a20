"""The overhead governor: holds what the sampling sources cost the program under ``overhead.budget``.

PC sampling and SASS metrics cost the observed program almost only while a window is open: CUPTI
control calls on the application's thread (Start/Stop/GetData, Enable/Flush/Disable), our own
Python work that takes the GIL (decoding), and kernels that run slower while they are sampled or
patched. Each governed source measures what every window cost and asks its ``Throttle`` for the
next window's length and the pause before it. The throttle gives the source its share of the
budget (the budget split evenly among the session's governed sources) and sets the duty cycle so
that cost per cycle / cycle length stays under that share:

    cycle = unit_cost x window / (HEADROOM x share);  pause = cycle - window

where ``unit_cost`` is the measured cost per second of open window, smoothed (quick to rise, slow
to fall: a costlier phase of the program is met at the next window, a cheaper one earns samples back
gradually). When the longest pause the source names would not hold the share, windows get shorter,
and past the shortest window pauses grow beyond it: the budget is what is held.

A source whose window costs the same whatever its length (SASS: every kernel launched while it is
open runs patched until the launch queue drains) is governed per window instead
(``per_window=True``): ``unit_cost`` is the cost of one window, windows keep their longest length,
and ``cycle = unit_cost / (HEADROOM x share)``.

What a window costs is ``WindowCost``: host seconds are measured; GPU seconds are an estimate from
the window's length (``PC_SAMPLING_KERNEL_SLOWDOWN``, ``SASS_KERNEL_SLOWDOWN``), because the probe
does no per-record work and so does not see kernel durations. ``docs/performance.md`` has the
benchmark that checks the total against the budget on the GPU.

Every decision that changes the plan is a ``GovernorDecision`` event, with the measurements behind it.
"""

from __future__ import annotations

import collections
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from cuptistream.channel.messages import WindowRecords
from cuptistream.events import GovernorDecision

# The program's time lost to a window beyond the measured host time, as a fraction of the window's
# length. PC sampling: a window costs the program several times its measured control calls (the
# GPU pipeline drains around Start/Stop, and sampled kernels run slower): 0.6 covers that (see
# docs/performance.md). SASS: patched kernels run ten to a hundred times slower or more, so the
# whole window is charged.
PC_SAMPLING_KERNEL_SLOWDOWN = 0.6
SASS_KERNEL_SLOWDOWN = 1.0

_RISE = 0.7  # smoothing weight of a new measurement above the running unit cost
_FALL = 0.2  # ... and below it
_ANNOUNCE_CHANGE = 0.1  # a plan that moves less than this (relative) is not announced again
CLAIM_RETRY_S = 0.05  # how soon a due window asks again while another source's window is open
# The plans aim at this part of each share: what a window is charged is within about 10% of what
# the program lost around it (see docs/performance.md), and the budget is a ceiling.
HEADROOM = 0.9


@dataclass(frozen=True)
class WindowCost:
    """What one window cost the program, in seconds."""

    open_s: float  # how long the window was open
    host_s: float  # measured: control calls on the application's thread, and our GIL-holding work
    gpu_s: float  # estimated: extra GPU time of the kernels sampled or patched
    # Wall time from the window's first control call until it was reported: longer than open_s
    # where work follows the window (SASS: FlushData, Disable and decoding take seconds).
    elapsed_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.host_s + self.gpu_s


@dataclass(frozen=True)
class Plan:
    """The next window's length and the pause before it opens, in seconds."""

    window_s: float
    pause_s: float

    @property
    def duty(self) -> float:
        return self.window_s / (self.window_s + self.pause_s)


@runtime_checkable
class Governed(Protocol):
    """A source whose duty cycle the governor sets: the probe hands it the session's governor
    before ``start()``."""

    def use_governor(self, governor: Governor) -> None: ...


@runtime_checkable
class WindowPriced(Protocol):
    """A governed source whose windows the collector counts (``WindowRecords``): the activity
    source prices each budget window by the records it held."""

    def window_records(self, records: WindowRecords) -> None: ...


class Governor:
    """One per session; each governed source makes a ``Throttle`` on it.

    ``budget`` is a fraction of the program's time (0.01 for 1%), or None: no governing, every
    throttle plans the source's configured window and pause. ``emit`` gets each decision event.
    """

    def __init__(self, budget: float | None, emit: Callable[[GovernorDecision], None]) -> None:
        self.budget = budget
        self._emit = emit
        self._lock = threading.Lock()
        self._throttles: list[Throttle] = []
        self._holder: str | None = None  # the source whose window is open now (see claim())
        self._claims = 0
        self._quiet_until = 0.0  # time.monotonic() before which no window opens (see release())

    def _register(self, throttle: Throttle) -> None:
        with self._lock:
            self._throttles.append(throttle)

    @property
    def throttles(self) -> tuple[Throttle, ...]:
        """Every throttle made on this governor, in order (each names its source and keeps the
        windows it measured)."""
        with self._lock:
            return tuple(self._throttles)

    def leave(self, source: str) -> None:
        """Drop ``source``'s throttles (a source that failed to start): the others split the budget;
        each takes the larger share at its next plan."""
        self.release(source, every=True)
        with self._lock:
            self._throttles = [t for t in self._throttles if t.source != source]

    def claim(self, source: str) -> bool:
        """Take the session's window slot for ``source`` before it opens a window; False while another
        source's window is open (try again later). A source may hold several claims (one per sampled
        context); each ``release`` returns one.

        Windows of different sources never overlap, so their costs do not stack into one stall and
        each window's measured cost is its own. A source whose claim fails asks again after
        ``CLAIM_RETRY_S``."""
        with self._lock:
            if self._holder not in (None, source) or (
                self._holder is None and time.monotonic() < self._quiet_until
            ):
                return False
            self._holder = source
            self._claims += 1
            return True

    def release(self, source: str, every: bool = False, settle_s: float = 0.0) -> None:
        """Return one of ``source``'s claims (all of them with ``every``, e.g. when it stops). With
        ``settle_s``, the slot stays shut that long after the last claim is returned: for a window
        whose cost outlasts it (kernels launched before SASS's Disable still run patched)."""
        with self._lock:
            if self._holder != source:
                return
            self._claims = 0 if every else self._claims - 1
            if self._claims <= 0:
                self._holder, self._claims = None, 0
                self._quiet_until = time.monotonic() + settle_s

    def share(self) -> float | None:
        """Each governed source's part of the budget."""
        if self.budget is None:
            return None
        with self._lock:
            return self.budget / max(1, len(self._throttles))

    def announce(self, decision: GovernorDecision) -> None:
        self._emit(decision)


class Throttle:
    """One source's duty cycle under its share of the budget. Thread-safe.

    ``window_s`` and ``pause_s`` are the source's configured window and pause (kept as they are when
    there is no budget). ``prior_unit_cost`` is the cost per second of open window to assume before
    the first measurement; ``min_window_s`` (default: ``window_s``) is the shortest window and
    ``max_pause_s`` the pause past which windows get shorter. With ``per_window`` the prior is the
    cost of one window, whatever its length: windows keep ``window_s`` and only the pause moves.
    Joins ``governor``'s budget split on creation."""

    def __init__(
        self,
        governor: Governor,
        source: str,
        *,
        window_s: float,
        pause_s: float,
        prior_unit_cost: float,
        min_window_s: float | None = None,
        max_pause_s: float = math.inf,
        timestamp: Callable[[], int],
        per_window: bool = False,
    ) -> None:
        self.governor = governor
        self.source = source
        self.max_window_s = window_s
        self.configured_pause_s = pause_s
        self.min_window_s = window_s if min_window_s is None else min(min_window_s, window_s)
        self.max_pause_s = max_pause_s
        self.per_window = per_window
        self.unit_cost = prior_unit_cost  # smoothed cost per second of open window, or per window
        self._timestamp = timestamp
        self._lock = threading.Lock()
        self._announced: Plan | None = None
        self.windows = 0
        governor._register(self)
        # The last windows measured: (time.monotonic() when the source reported it, its cost).
        self.history: collections.deque[tuple[float, WindowCost]] = collections.deque(maxlen=256)
        self.plan = self._decide()

    def first(self) -> Plan:
        """The plan before any window was measured (from the prior), announced once."""
        with self._lock:
            self.plan = self._decide()
            self._announce(self.plan, None, "first plan, from the expected cost of this source")
            return self.plan

    def first_delay(self) -> float:
        """How long to wait before the first window: a random point of the first pause under a budget
        (so a run's cost does not depend on when it is measured, and the processes of a job do
        not all sample at once), none without one."""
        if self.governor.budget is None:
            return 0.0
        return random.uniform(0.0, self.plan.pause_s)

    def window_done(self, cost: WindowCost) -> Plan:
        """Take one window's measured cost; return the plan for the next window."""
        with self._lock:
            self.windows += 1
            self.history.append((time.monotonic(), cost))
            if self.per_window or cost.open_s > 0:
                measured = cost.total_s if self.per_window else cost.total_s / cost.open_s
                weight = _RISE if measured > self.unit_cost else _FALL
                self.unit_cost += weight * (measured - self.unit_cost)
            self.plan = self._decide()
            self._announce(self.plan, cost, "a window was measured")
            return self.plan

    def _decide(self) -> Plan:
        share = self.governor.share()
        if share is None:
            return Plan(self.max_window_s, self.configured_pause_s)
        share *= HEADROOM
        unit = max(self.unit_cost, 1e-9)
        window = self.max_window_s
        if self.per_window:
            return Plan(window, max(unit / share - window, window))
        if unit * window / share - window > self.max_pause_s:
            # The longest pause would overspend: shorter windows first, down to the floor ...
            window = min(window, max(self.min_window_s, share * self.max_pause_s / max(unit - share, 1e-9)))
        # ... then longer pauses: the budget wins over max_pause_s (a SASS window costs the same
        # whatever its length when it patches every kernel). Never more than half the time sampling.
        pause = max(unit * window / share - window, window)
        return Plan(window, pause)

    def expected_cost(self, plan: Plan) -> float:
        """The share of the program's time ``plan`` should cost at the current unit cost."""
        if self.per_window:
            return self.unit_cost / (plan.window_s + plan.pause_s)
        return self.unit_cost * plan.duty

    def _announce(self, plan: Plan, cost: WindowCost | None, why: str) -> None:
        last = self._announced
        if last is not None and _close(plan.window_s, last.window_s) and _close(plan.pause_s, last.pause_s):
            return
        if last is not None:
            why = f"{why}; the plan moved by more than {_ANNOUNCE_CHANGE:.0%}"
        self._announced = plan
        share = self.governor.share()
        self.governor.announce(
            GovernorDecision(
                timestamp=self._timestamp(),
                source=self.source,
                budget=self.governor.budget or 0.0,
                share=share or 0.0,
                window_s=round(plan.window_s, 6),
                pause_s=round(plan.pause_s, 6),
                duty=round(plan.duty, 6),
                unit_cost=round(self.unit_cost, 6),
                expected_cost=round(self.expected_cost(plan), 6),
                per_window=self.per_window,
                measured_open_s=round(cost.open_s, 6) if cost else 0.0,
                measured_host_s=round(cost.host_s, 6) if cost else 0.0,
                estimated_gpu_s=round(cost.gpu_s, 6) if cost else 0.0,
                windows=self.windows,
                reason=why,
            )
        )


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _ANNOUNCE_CHANGE * max(abs(a), abs(b), 1e-9)
