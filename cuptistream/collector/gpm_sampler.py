"""The collector sampling a device's counters itself, through NVML's GPM: no CUDA context, no GPU
memory, and no probe that has to stay up for the device to be sampled.

``collector.samplers`` starts one ``CollectorSampler`` per device whose probes asked to sample it
through NVML, with the first ask's interval, metrics and decode period, and stops it once none of
them is left. Its events go where the device's probe's would: ``PmSamples`` through the emitter of
one of the probes it serves (``serve``: its process, its CUDA ordinal of the device), their
``PmStats`` beside them, and every sample to each stream's kernel attribution (``SampleBoard``).
Samples are stamped on the probes' CUPTI clock (the collector's reading of it, ``clock``), as a
probe's own would be.

Failure modes: ``start`` raises ``GpmUnavailable`` where NVML cannot sample the device here (no
driver library in the collector's container, a chip before Hopper, a MIG instance, no permission);
the probe then samples it as before. Samples NVML fails while sampling are counted as a Loss
(``sample_failed``) and said once per reason; sampling goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from cuptistream.channel.messages import GpmAsk
from cuptistream.collector.pm_samples import SampleBoard
from cuptistream.events import Event, PmSamples, nan_as_none
from cuptistream.nvml.gpm import GpmSession
from cuptistream.plugin import Emitter
from cuptistream.statistics.pm_fold import PmFold

STAGE = "pm_sampling"
ORIGIN = "collector:pm_sampling"


class Served(Protocol):
    """A probe connection the collector samples for, as the sampler sees it."""

    emitter: Emitter
    ordinals: dict[str, int]  # device UUID -> the process's CUDA ordinal


class CollectorSampler:
    """GPM sampling of device ``uuid`` in the collector, decoded every ``ask.decode_period_ns`` on
    a thread of its own. ``stats_interval_ns``: the statistics' interval (0: no ``PmStats``).
    Thread-safe: the grants and ``cuptistream trace`` call it from their threads."""

    def __init__(
        self, uuid: str, ask: GpmAsk, clock: Callable[[], int], board: SampleBoard,
        stats_interval_ns: int = 0, gpm_factory: Callable[[str, Callable[[], int]], Any] = GpmSession,
    ) -> None:  # fmt: skip
        self.uuid = uuid
        self.ask = ask
        self._board = board
        self._session = gpm_factory(uuid, clock)
        self._fold = PmFold(stats_interval_ns) if stats_interval_ns > 0 else None
        self._lock = threading.Lock()  # the target, between the grants' thread and the decode thread
        self._life = threading.Lock()  # start, lend, take back and stop, one at a time
        self._target: Served | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lent_at = 0.0  # monotonic time the counters were lent to a metrics window (0: not lent)
        self._stopped = False
        self._failure_said = ""
        self._since = 0
        self.name = ""

    def start(self, target: Served, since: int = 0) -> None:
        """Enable, configure and start GPM on the device, and the decode thread. ``GpmUnavailable``
        (or NVML's own error, where it cannot allocate a sample; nothing left running) where NVML
        cannot sample it. ``since``: where a probe sampled the
        device before, its last sample's end (CUPTI clock ns): the samples missing from there to
        the first here are a Loss (``sampler_handover``)."""
        with self._life:
            self._target = target
            self._since = since
            self._begin()

    def serve(self, target: Served) -> None:
        """From now on, events go through ``target``'s emitter (the one served before has left)."""
        with self._lock:
            self._target = target

    def lend(self) -> None:
        """Stop sampling while a metrics window of the probes (``cuptistream trace --metrics``)
        profiles the device's kernels, as a probe's source lends its counters: what was sampled is
        handed on, the statistics' intervals stay open."""
        with self._life:
            if not self._stopped and not self._lent_at:
                self._end()
                self._lent_at = time.monotonic()

    def take_back(self) -> None:
        """Sample again after the window; the samples missed meanwhile are a Loss
        (``counters_lent``). Where GPM does not start again, one warning says so and the device
        stays unsampled."""
        with self._life:
            if self._stopped or not self._lent_at:
                return
            missed = round((time.monotonic() - self._lent_at) * 1e9 / self.ask.interval_ns)
            self._lent_at = 0.0
            target = self._current()
            if target is not None:
                self._lost(target.emitter, "counters_lent", missed)
            try:
                self._begin()
            except Exception as error:  # GpmUnavailable, or NVML's own error (out of memory for a sample)
                self._stopped = True
                if target is not None:
                    target.emitter.report_error(
                        ORIGIN,
                        f"GPM sampling of GPU {self.uuid} did not start again after a metrics window "
                        f"({error}); the device is not sampled",
                    )

    def stop(self) -> None:
        """Stop sampling, and hand on what was sampled and the intervals still open."""
        with self._life:
            if self._stopped:
                return
            self._stopped = True
            if not self._lent_at:
                self._end()
            if self._fold is not None:
                self._hand_on(list(self._fold.close()))

    def _begin(self) -> None:
        self.name = self._session.enable()
        try:
            self._session.configure(self.ask.metrics, self.ask.interval_ns, 0)
            self._session.start()
        except BaseException:
            self._session.disable()
            raise
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(self._stopping,), name="cuptistream-collector-gpm", daemon=True
        )
        self._thread.start()

    def _end(self) -> None:
        """Stop the decode thread and the session, and hand on their last samples."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._session.stop()
        self._decode()
        self._session.disable()

    def _run(self, stopping: threading.Event) -> None:
        period = self.ask.decode_period_ns / 1e9
        while not stopping.wait(period):
            self._decode()

    def _decode(self) -> None:
        got = self._session.decode()
        target = self._current()
        if target is None:
            return
        if got.failed:
            self._lost(target.emitter, "sample_failed", got.failed)
            if got.failure != self._failure_said:
                self._failure_said = got.failure
                target.emitter.report_error(
                    ORIGIN,
                    f"{got.failed} GPM samples of GPU {self.uuid} failed in the collector ({got.failure}); "
                    "the intervals on either side of each are missing, and sampling goes on",
                    severity="warning",
                )
        if got.overflow:  # more pairs than the session holds between decodes: the oldest went
            self._lost(target.emitter, "hardware_buffer_full", 1)
        if not got.ends:
            return
        if self._since:
            self._lost(
                target.emitter,
                "sampler_handover",
                max(0, got.starts[0] - self._since) // self.ask.interval_ns,
            )
            self._since = 0
        samples = PmSamples(
            device_id=target.ordinals.get(self.uuid, 0), chip=self.name, metrics=list(self.ask.metrics),
            starts=got.starts, ends=got.ends, values=[nan_as_none(column) for column in got.values],
        )  # fmt: skip
        self._board.publish(samples, self.uuid)
        out: list[Event] = [samples]
        if self._fold is not None:
            out += self._fold.add(samples)
        target.emitter.emit(out)

    def _hand_on(self, events: list[Event]) -> None:
        target = self._current()
        if target is not None and events:
            target.emitter.emit(events)

    def _current(self) -> Served | None:
        with self._lock:
            return self._target

    @staticmethod
    def _lost(emitter: Emitter, reason: str, count: int) -> None:
        if count:
            emitter.report_loss(STAGE, reason, count, unit="samples")
