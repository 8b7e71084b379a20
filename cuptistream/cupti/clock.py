"""The CUPTI clock: what every activity timestamp is measured on, and its offset to Unix time."""

from __future__ import annotations

import time

from cuptistream.cupti import driver
from cuptistream.events import ClockSync


def cupti_now() -> int:
    """CUPTI's timestamp in ns (``cuptiGetTimestamp``)."""
    return driver.timestamp()


def clock_sync() -> ClockSync:
    """One CUPTI reading and one Unix reading, taken back to back (the Unix one bracketed by two
    CUPTI reads and paired with their midpoint, so the offset error is half the bracket)."""
    before = driver.timestamp()
    unix = time.time_ns()
    after = driver.timestamp()
    return ClockSync(cupti_ns=(before + after) // 2, unix_ns=unix)
