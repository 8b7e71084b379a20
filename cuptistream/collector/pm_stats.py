"""The collector's side of PM sampling statistics: find a probe's ``PmSamples`` in its event chunks
(one scan, no decoding of other chunks) and fold them per interval (``statistics.pm_fold``)."""

from __future__ import annotations

import re
from collections.abc import Callable

import msgspec

from cuptistream.events import AnyEvent, Event, PmSamples
from cuptistream.plugin import Emitter
from cuptistream.recording.codec import array_header
from cuptistream.statistics.pm_fold import PmFold

_events = msgspec.msgpack.Decoder(list[AnyEvent])
_has_pm_samples = re.compile(rb"\xa4type\xaapm_samples").search  # an encoded PmSamples' type key and tag


class PmStatsJoin:
    """Per probe connection: ``PmStats`` from the ``PmSamples`` its chunks carry, each also handed
    to ``publish`` (the kernel attribution's, ``collector.pm_samples``). Never raises."""

    def __init__(
        self, interval_ns: int, emitter: Emitter, origin: str,
        publish: Callable[[PmSamples], None] | None = None,
    ) -> None:  # fmt: skip
        self._publish = publish
        self._fold = PmFold(interval_ns)
        self._emitter = emitter
        self._origin = origin

    def chunk(self, payload: bytes, count: int, emitter: Emitter, origin: str) -> None:
        """One chunk of the probe's events, as sent; ``emitter`` and ``origin`` are the connection's
        current ones (they change once the probe said who it is)."""
        self._emitter, self._origin = emitter, origin
        if _has_pm_samples(payload) is None:
            return
        try:
            events = _events.decode(array_header(count) + payload)
            out: list[Event] = []
            for event in events:
                if isinstance(event, PmSamples):
                    out += self._fold.add(event)
                    if self._publish is not None:
                        self._publish(event)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as error:
            self._emitter.report_error(self._origin, f"pm_samples not folded: {error}", severity="warning")
            return
        if out:
            self._emitter.emit(out)

    def close(self) -> None:
        """Emit the intervals still open (the probe left)."""
        try:
            out: list[Event] = list(self._fold.close())
        except Exception as error:
            self._emitter.report_error(self._origin, f"pm_stats not closed: {error}", severity="warning")
            return
        if out:
            self._emitter.emit(out)
