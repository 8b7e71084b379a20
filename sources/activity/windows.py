"""Windows of full tracing: ``activity.mode: budget``'s, at random phases under ``overhead.budget``,
and deep windows on demand (``cuptistream trace --for``), in either mode.

Continuous tracing costs the program a large fraction of its untraced time (docs/performance.md,
row "bare CUPTI against untraced"), so under a budget the source traces its kinds only inside
windows. One thread runs them, one at a
time:

- **Budget windows.** The governor's ``Throttle`` plans each window's length and the pause before
  the next; a ``Schedule`` (``schedule.py``) places them: at phases of the process's own, or, for
  the ranks of one job, at the same moments in every rank. After a window closes, the
  collector answers with what it decoded from it (``WindowRecords``); the window's cost is the host
  time of our control calls plus those records priced at ``UNIT_COST_S``, and the throttle plans the
  next cycle from it. A collector that does not answer within ``_PRICE_WAIT_S`` leaves the window
  priced at the throttle's current unit cost (no new information).
- **On-demand windows** open as soon as the thread is free (a budget window open at the time
  closes first: at most ``window`` later) and are charged to no budget.

The tracer (the activity source) opens and closes the windows: it enables the kinds, and on close
disables them, forces a flush and then sends the window's closing ``TraceSpan``, so the collector
has decoded every record of a window when it learns that the window closed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Protocol

from cuptistream.channel.messages import WindowRecords
from cuptistream.overhead import Plan, Throttle, WindowCost

from .schedule import FreeSchedule, Schedule

# What tracing costs the observed program per record the collector decoded, in seconds: CUPTI's work
# on the launching thread plus the instrumented kernels' extra GPU time, from (traced - untraced)
# time per iteration over records per iteration of bench/overhead_gpu.py's workloads, measured on an
# H100 (a calibration: another chip's costs differ). The largest per-workload figure is used: a budget
# is a ceiling.
UNIT_COST_S: dict[str, float] = {
    "kernel": 8.0e-6, "graph_kernel": 1.0e-6, "api": 2.0e-6, "memcpy": 8.0e-6, "memset": 8.0e-6,
}  # fmt: skip
_OTHER_UNIT_COST_S = 2.0e-6
PRIOR_UNIT_COST = 0.6  # per second of open window, until the first window is priced (W1-like loop)
_PRICE_WAIT_S = 2.0


class Tracer(Protocol):
    """What the windows open and close (the activity source)."""

    @property
    def name(self) -> str: ...

    def begin_window(self, on_demand: bool, request: int) -> int | None:
        """Trace every configured kind from now; the window's number, or None (CUPTI is not ours now)."""

    def end_window(self, window: int) -> None:
        """Stop the window's kinds, hand over its records, then say it closed."""

    def helper_cpu_s(self) -> float:
        """CPU seconds used so far by the threads that work only while a window is open (the stack
        sampler): a budget window is charged what they used meanwhile."""


class Profile(Protocol):
    """What runs beside an on-demand window's tracing (``kernel_profile.KernelProfile``)."""

    def start(self) -> None: ...
    def finish(self) -> None:
        """Before the window's close: emit what was measured."""
        ...

    def cancel(self) -> None:
        """The window did not open: release what was prepared."""
        ...


class Windows:
    """The window thread of one activity source. ``throttle`` is None for on-demand windows only
    (``activity.mode: full``); ``schedule`` places the budget windows (default: phases of its own,
    ``FreeSchedule``)."""

    def __init__(self, tracer: Tracer, throttle: Throttle | None, schedule: Schedule | None = None) -> None:
        self.tracer = tracer
        self.throttle = throttle
        self.schedule = schedule or FreeSchedule(throttle.first_delay if throttle else lambda: 0.0)
        self.opened = 0  # budget windows opened
        self.on_demand = 0  # on-demand windows opened
        # (seconds, request, what runs beside it) from the collector
        self._requests: deque[tuple[float, int, Profile | None]] = deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._priced: dict[int, WindowRecords] = {}
        self._priced_cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopping.clear()
        name = f"cuptistream-{self.tracer.name}-windows"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close an open window (its records handed over) and end the thread."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def request(self, seconds: float, request: int, profile: Profile | None = None) -> None:
        """Open an on-demand window of ``seconds`` as soon as possible, with ``profile`` running
        beside it. Never waits."""
        self._requests.append((seconds, request, profile))
        self._wake.set()

    def priced(self, records: WindowRecords) -> None:
        """The collector's count of a closed window's records (any thread)."""
        with self._priced_cv:
            self._priced[records.window] = records
            self._priced_cv.notify_all()

    # --- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        throttle = self.throttle
        due = 0.0
        if throttle is not None:
            due = time.monotonic() + self.schedule.first(throttle.first())
        while not self._stopping.is_set():
            if self._requests:
                self._on_demand(*self._requests.popleft())
                continue
            if throttle is None:
                self._wait(None)
                continue
            now = time.monotonic()
            if now < due:
                self._wait(due - now)
                continue
            if not throttle.governor.claim(throttle.source):  # another source's window is open
                due = now + self.schedule.missed(throttle.plan)
                continue
            try:
                plan = self._budget_window(throttle)
            finally:
                throttle.governor.release(throttle.source)
            due = time.monotonic() + self.schedule.next(plan)

    def _wait(self, seconds: float | None) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _on_demand(self, seconds: float, request: int, profile: Profile | None) -> None:
        window = self.tracer.begin_window(True, request)
        if window is None:
            if profile is not None:
                profile.cancel()
            return
        self.on_demand += 1
        if profile is not None:
            profile.start()
        self._stopping.wait(seconds)
        if profile is not None:
            profile.finish()
        self.tracer.end_window(window)

    def _budget_window(self, throttle: Throttle) -> Plan:
        """Open, hold and close one window; the plan its measured cost gives."""
        length = throttle.plan.window_s
        began = time.monotonic()
        helpers = self.tracer.helper_cpu_s()
        host = time.thread_time()
        window = self.tracer.begin_window(False, 0)
        if window is None:  # CUPTI is another tool's now: try again after a pause
            return throttle.plan
        self.opened += 1
        opened = time.monotonic()
        host_s = time.thread_time() - host
        self._stopping.wait(length)
        host = time.thread_time()
        open_s = time.monotonic() - opened
        self.tracer.end_window(window)
        host_s += time.thread_time() - host + self.tracer.helper_cpu_s() - helpers
        records = self._wait_priced(window)
        app_s = price(records) if records is not None else throttle.unit_cost * open_s
        cost = WindowCost(open_s=open_s, host_s=host_s, gpu_s=app_s, elapsed_s=time.monotonic() - began)
        return throttle.window_done(cost)

    def _wait_priced(self, window: int) -> WindowRecords | None:
        with self._priced_cv:
            self._priced_cv.wait_for(lambda: window in self._priced or self._stopping.is_set(), _PRICE_WAIT_S)
            return self._priced.pop(window, None)


def price(records: WindowRecords) -> float:
    """What a window's records cost the program, in seconds (``UNIT_COST_S``)."""
    return sum(count * UNIT_COST_S.get(kind, _OTHER_UNIT_COST_S) for kind, count in records.records.items())
