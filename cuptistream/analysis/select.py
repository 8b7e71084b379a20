"""Which part of a recording a view looks at: processes, ranks, devices and a time window.

Times on the command line are either absolute (``2026-11-21T10:00:00Z``, naive times are local, or
``@1795293852.5`` Unix seconds) or a duration from the recording's start (``30s``, ``+1.5ms``). The
recording's start is the earliest event of the first batch that passes the process filters: views
stream, so they cannot know the true earliest event before reading everything.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cuptistream.config.units import parse_duration
from cuptistream.errors import UserError
from cuptistream.events import Resource


@dataclass(frozen=True)
class TimeSpec:
    """A parsed ``--since``/``--until`` value: absolute Unix ns, or ns after the recording's start."""

    text: str
    unix_ns: int | None = None
    after_start_ns: int | None = None

    def resolve(self, start_unix_ns: int) -> int:
        if self.unix_ns is not None:
            return self.unix_ns
        assert self.after_start_ns is not None
        return start_unix_ns + self.after_start_ns


def parse_time(option: str, text: str) -> TimeSpec:
    """Parse one ``--since``/``--until`` value. Raises ``UserError`` naming the option."""
    value = text.strip()
    try:
        if value.startswith("@"):
            return TimeSpec(text, unix_ns=round(float(value[1:]) * 1e9))
        if len(value) >= 10 and value[4:5] == "-" and value[:4].isdigit():
            moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.astimezone()  # naive: local time, as people type it
            return TimeSpec(text, unix_ns=round(moment.timestamp() * 1e9))
        return TimeSpec(text, after_start_ns=round(parse_duration(value.removeprefix("+")) * 1e9))
    except ValueError:
        raise UserError(
            f"{option} {text!r}: expected a duration from the start (30s, +1.5ms), an ISO time "
            "(2026-11-21T10:00:00Z) or @UNIX_SECONDS"
        ) from None


def parse_ids(option: str, text: str) -> frozenset[int]:
    """``0,2,5`` -> {0, 2, 5}. Raises ``UserError`` naming the option."""
    try:
        ids = frozenset(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        ids = frozenset()
    if not ids or any(i < 0 for i in ids):
        raise UserError(f"{option} {text!r}: expected non-negative integers separated by commas, e.g. 0,1")
    return ids


@dataclass
class Selection:
    """The filters of one view. Empty filters select everything.

    ``devices`` applies to GPU work and sampling; host-side events (API calls, NVTX, losses, errors)
    name no device and are kept.
    """

    pids: frozenset[int] | None = None
    ranks: frozenset[int] | None = None
    devices: frozenset[int] | None = None
    since: TimeSpec | None = None
    until: TimeSpec | None = None
    _window: tuple[int, int] | None = field(default=None, init=False)

    def accepts(self, resource: Resource) -> bool:
        if self.pids is not None and resource.pid not in self.pids:
            return False
        return self.ranks is None or resource.rank in self.ranks

    @property
    def timed(self) -> bool:
        return self.since is not None or self.until is not None

    def window(self, offset_ns: int, events: Sequence[Any]) -> tuple[int, int]:
        """[since, until) in Unix ns, fixed by the first batch that reaches it."""
        if self._window is None:
            start = min(_times(events), default=0) + offset_ns
            low = self.since.resolve(start) if self.since else -(2**63)
            high = self.until.resolve(start) if self.until else 2**63
            if high <= low:
                raise UserError(f"--until {self.until.text if self.until else ''!r} is not after --since; "
                                "widen the window")  # fmt: skip
            self._window = (low, high)
        return self._window


def _times(events: Iterable[Any]) -> Iterable[int]:
    for event in events:
        if type(event).__name__ == "SelfStats":  # Unix-epoch ns, not the event clock
            continue
        # No family has two; the summary's Structs answer 0 for a start they lack. Statistics events
        # have an interval: a recording of statistics alone must still anchor --since/--until.
        start = (
            getattr(event, "start", None)
            or getattr(event, "timestamp", None)
            or getattr(event, "interval_start", None)
        )
        if start:  # 0 means "not recorded" in a few families
            yield start
