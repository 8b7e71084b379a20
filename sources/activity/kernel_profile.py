"""Per-kernel hardware metrics in an on-demand window (``cuptistream trace --for 10s --metrics SET``):
while the window traces, CUPTI's range profiler measures every kernel launched on each device that
has a primary context, each launch a range of its own (auto range), replayed by CUPTI as many times
as the metrics need passes (kernel replay). CUPTI numbers the ranges; the kernels' names come
from the launches noted meanwhile (``launch_names``). At the window's close the ranges are evaluated and
folded per kernel name into one ``KernelMetrics`` event per device, emitted before the window's
closing span, so ``cuptistream trace`` returns once they are delivered.

Cost, inside the window only: kernel replay serializes the launches (each waits for the one before)
and runs each ``passes`` times, saving and restoring the memory it writes between passes. The
counter data image holds ``MAX_RANGES`` launches per device; launches past them still run under the
profiler but are not measured (``not_profiled``).

Failure modes: ``open`` raises ``ConfigError`` (a bad ``--metrics``) or ``RuntimeError`` (no CUDA
context to profile, CUPTI without a range profiler); the collector shows the line as the source's
refusal. PM sampling in this process lends the window its counters (``counter_loans``); failures
once the window runs (the counters held by PM sampling in another process, or by another tool) are
``error`` events and the window's records are delivered without metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cuptistream.cupti import counter_loans, driver
from cuptistream.cupti.kernel_metrics import KernelMetricChoice, choose
from cuptistream.cupti.range_profiler_api import Ranges
from cuptistream.events import KernelMetrics
from cuptistream.plugin import Emitter

if TYPE_CHECKING:
    from cuptistream.cupti.launch_names import LaunchNames

MAX_RANGES = 4096  # launches measured per device and window
UNNAMED = "[kernel not named]"  # a range whose launch was not noted (see ``launch_names``)
_FLUSH_S = 5.0  # the events' hand-over before the window's close is announced
_LEND_S = 5.0  # for PM sampling to stop and disable (a decode of what its buffer holds included)


class RangeSession(Protocol):
    """One context's range profiling (``range_profiler_api.RangeProfilerSession`` on a GPU)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def collect(self) -> Ranges: ...
    def close(self) -> None: ...


class DeviceSide(Protocol):
    """What the profile needs of CUDA and CUPTI; tests without a GPU hand in a stand-in."""

    def contexts(self) -> dict[int, int]:
        """Device ordinal -> its active primary context."""
        ...

    def chip(self, device: int) -> str: ...

    def session(self, device: int, context: int, choice: KernelMetricChoice, max_ranges: int) -> RangeSession:
        """Enabled and configured, not started."""
        ...

    def watch_launches(self) -> None:
        """Note the name of every kernel launched from now on, per context, in launch order."""
        ...

    def launched(self, context: int) -> list[str]:
        """The kernels noted on ``context``, in launch order (CUPTI names its auto ranges "0", "1", ...)."""
        ...

    def release(self) -> None:
        """Undo what ``chip``, ``session`` and ``watch_launches`` began."""
        ...


@dataclass
class _Device:
    device: int
    context: int
    choice: KernelMetricChoice
    session: RangeSession | None = None


class KernelProfile:
    """One window's range profiling: ``open`` (checks, on the caller's thread), then ``start`` and
    ``finish`` on the window's thread."""

    def __init__(
        self,
        devices: list[_Device],
        side: DeviceSide,
        emitter: Emitter,
        origin: str,
        loan: counter_loans.Loan,
    ) -> None:
        self._devices = devices
        self._side = side
        self._loan = loan
        self._emitter = emitter
        self._origin = origin
        self._start = 0

    @classmethod
    def open(cls, spec: str, emitter: Emitter, origin: str, side: DeviceSide | None = None) -> KernelProfile:
        """The metrics of ``spec`` checked on every device with a context. Raises ``ConfigError`` or
        ``RuntimeError`` (one line each)."""
        side = side or CuptiDeviceSide()
        contexts = side.contexts()
        if not contexts:
            side.release()
            raise RuntimeError("--metrics: no CUDA context in this process yet: nothing to profile")
        # PM sampling in this process holds the same counters: it lets go of them for the window.
        loan = counter_loans.borrow(contexts, _LEND_S)
        for device in loan.refused:
            emitter.report_error(
                origin, f"kernel metrics: PM sampling of device {device} did not let go of the counters "
                f"within {_LEND_S:g}s; the device's profiling will likely fail", "warning",
            )  # fmt: skip
        try:
            devices = [_Device(d, ctx, choose(spec, side.chip(d))) for d, ctx in sorted(contexts.items())]
        except BaseException:
            side.release()
            loan.give_back()
            raise
        return cls(devices, side, emitter, origin, loan)

    def start(self) -> None:
        """Start profiling on every device; a device that fails is an ``error`` event."""
        self._start = driver.timestamp()
        try:
            self._side.watch_launches()
        except Exception as error:  # the ranges keep CUPTI's numbers for names
            self._emitter.report_error(
                self._origin, f"kernel metrics: cannot note the kernels' names: {error}", "warning"
            )
        for dev in self._devices:
            try:
                dev.session = self._side.session(dev.device, dev.context, dev.choice, MAX_RANGES)
                dev.session.start()
            except Exception as error:
                self._failed(dev, "could not start", error)

    def finish(self) -> None:
        """Stop, evaluate and emit one ``KernelMetrics`` per device; then release everything."""
        end = driver.timestamp()
        events = []
        for dev in self._devices:
            if dev.session is None:
                continue
            try:
                dev.session.stop()
                ranges = dev.session.collect()
            except Exception as error:
                self._failed(dev, "could not be read", error)
                continue
            events.append(_fold(dev, _named(ranges, self._side.launched(dev.context)), self._start, end))
            self._close(dev)
        self.cancel()
        if events:
            self._emitter.emit(events)
            self._emitter.flush(_FLUSH_S)  # the events go out before the window's close

    def cancel(self) -> None:
        """Release what ``open`` initialized (also when the window did not open)."""
        try:
            self._side.release()
        except Exception as error:  # the window's records go on regardless
            self._emitter.report_error(
                self._origin, f"kernel metrics: releasing CUPTI's profiler failed: {error}"
            )
        self._loan.give_back()

    def _failed(self, dev: _Device, what: str, error: Exception) -> None:
        message = f"kernel metrics of device {dev.device} {what}: {type(error).__name__}: {error}"
        self._emitter.report_error(self._origin, message)
        self._close(dev)

    @staticmethod
    def _close(dev: _Device) -> None:
        if dev.session is not None:
            session, dev.session = dev.session, None
            try:
                session.close()
            except Exception:  # disabling a profiler that failed: nothing more to do
                pass


def _named(ranges: Ranges, launched: list[str]) -> Ranges:
    """The ranges named after the kernels: range ``i`` measured the ``i``-th launch. Ranges past the
    launches noted (after a CUDA graph launch, or none noted) are ``UNNAMED``."""
    names = [launched[i] if i < len(launched) else UNNAMED for i in range(len(ranges.names))]
    return Ranges(names, ranges.values, ranges.dropped)


def _fold(dev: _Device, ranges: Ranges, start: int, end: int) -> KernelMetrics:
    """Per kernel name, in order of first launch: launches and each metric's mean (NaN left out)."""
    index: dict[str, int] = {}
    codes = np.array([index.setdefault(name, len(index)) for name in ranges.names], dtype=np.int64)
    launches = np.bincount(codes, minlength=len(index))
    values: list[list[float | None]] = []
    for column in np.asarray(ranges.values, dtype=np.float64).reshape(len(dev.choice.metrics), len(codes)):
        kept = ~np.isnan(column)
        sums = np.bincount(codes[kept], weights=column[kept], minlength=len(index))
        seen = np.bincount(codes[kept], minlength=len(index))
        values.append(
            [float(t) / n if n else None for t, n in zip(sums.tolist(), seen.tolist(), strict=True)]
        )
    return KernelMetrics(
        start=start, end=end, device_id=dev.device, chip=dev.choice.chip, metrics=list(dev.choice.metrics),
        passes=dev.choice.passes, names=list(index), launches=launches.tolist(), values=values,
        not_profiled=ranges.dropped,
    )  # fmt: skip


class CuptiDeviceSide:
    """The device side on a GPU: primary contexts, CUPTI's profiler and the range profiler."""

    def __init__(self) -> None:
        self._initialized = False
        self._hosts: list[Any] = []
        self._launches: LaunchNames | None = None

    def watch_launches(self) -> None:
        from cuptistream.cupti.launch_names import LaunchNames

        self._launches = LaunchNames()
        self._launches.start()

    def launched(self, context: int) -> list[str]:
        return self._launches.names(context) if self._launches is not None else []

    def contexts(self) -> dict[int, int]:
        from cuptistream.cupti.contexts import primary_contexts_by_device

        return primary_contexts_by_device()

    def chip(self, device: int) -> str:
        from cuptistream.cupti.profiler_host import chip_name, initialize_profiler

        if not self._initialized:
            initialize_profiler()
            self._initialized = True
        return chip_name(device)

    def session(self, device: int, context: int, choice: KernelMetricChoice, max_ranges: int) -> RangeSession:
        from cuptistream.cupti.contexts import make_current
        from cuptistream.cupti.profiler_host import ProfilerHost
        from cuptistream.cupti.range_profiler_api import RangeProfilerSession

        make_current(context)  # our window thread: the program's threads keep theirs
        host = ProfilerHost(choice.chip, "range_profiler")
        self._hosts.append(host)
        session = RangeProfilerSession(context, host)
        session.enable()
        try:
            session.configure(choice.metrics, max_ranges)
        except BaseException:
            session.close()
            raise
        return session

    def release(self) -> None:
        from cuptistream.cupti.profiler_host import deinitialize_profiler

        if self._launches is not None:
            self._launches.stop()
        for host in self._hosts:
            host.close()
        self._hosts = []
        if self._initialized:
            self._initialized = False
            deinitialize_profiler()
