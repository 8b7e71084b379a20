"""``Probe``: the config's sources running in this process, feeding a collector.

Telemetry never takes the observed program down: a source that fails to start is disabled with an
Error event and a one-line note on stderr, and the others keep running. ``stop()`` (also at exit
and on SIGTERM) stops the sources (each hands over what it holds: CUPTI's forced flush), sends the
queued events, and hangs up; the collector drains what was handed over.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from types import FrameType
from typing import Any

from cuptistream.channel import messages
from cuptistream.config import Config
from cuptistream.cupti.gpus import visible_devices
from cuptistream.events import ClockSync
from cuptistream.overhead import Governed, Governor, WindowPriced
from cuptistream.pipeline.resource import current_resource
from cuptistream.plugin import OnDemand, Source
from cuptistream.probe import torch_profiler
from cuptistream.probe.coexist import CuptiSharing
from cuptistream.probe.control import ControlReader
from cuptistream.probe.emitter import ProbeEmitter
from cuptistream.probe.link import ProbeLink
from cuptistream.probe.samplers import DeviceGrants, SharesDevice
from cuptistream.stacks import Stacked

# The end of ``shutdown_deadline`` the collector keeps for closing its sinks (as the pipeline's
# ``CLOSE_AFTER_DEADLINE_S``, not imported: the probe does not load the pipeline).
_COLLECTOR_CLOSE_S = 0.5
_ANSWER_WAIT_S = 2.0  # room in the channel for a ``WindowAnswer`` (the control thread may wait)


def note(message: str) -> None:
    print(f"cuptistream: {message}", file=sys.stderr, flush=True)


class Probe:
    """Not reusable: ``start()`` once, ``stop()`` once."""

    def __init__(self, config: Config, address: str, session_id: str, *, quiet: bool = False) -> None:
        self.config = config
        self.quiet = quiet
        self.sources: list[Source] = []
        self.failed_sources: dict[str, str] = {}
        resource = current_resource(config.session.job_env, command_line=config.session.command_line)
        self.link = ProbeLink(address, session_id, resource, visible_devices())
        probe_cfg = config.probe
        self.emitter = ProbeEmitter(
            self.link, probe_cfg.memory_budget, config.pipeline.full_policy,
            probe_cfg.event_buffer_size, probe_cfg.event_buffers, self.clock_sync,
        )  # fmt: skip
        self.governor = Governor(config.overhead.fraction, lambda decision: self.emitter.emit([decision]))
        self._lock = threading.Lock()
        self._stopped = False
        self._previous_sigterm: Any = None
        self.sharing: CuptiSharing | None = None  # CUPTI shared with other tools (probe.coexist)
        self.grants = DeviceGrants(self.link)  # which device's counters this process may sample
        self.control = ControlReader(
            self.link,
            {
                messages.OpenWindow: self._open_window,
                messages.WindowRecords: self._window_records,
                messages.SamplerGrant: self.grants.granted,
            },
        )

    def start(self) -> Probe:
        """Connect and start the sources. Raises ``ChannelError`` when no collector answers."""
        self.link.connect(self.clock_sync())
        self.emitter.start()
        cupti_sources: list[Source] = []
        for source_config, source_class in self.config.enabled_sources():
            source = source_class(source_config, self.emitter)
            if isinstance(source, Governed):
                source.use_governor(self.governor)
            if isinstance(source, Stacked):
                source.use_stacks(self.config.stacks)
            if isinstance(source, SharesDevice):
                source.use_grants(self.grants)
            if source.traces_cuda:  # CUPTI's: started through the sharing, which may stand it by
                cupti_sources.append(source)
                continue
            try:
                source.start()
            except Exception as error:
                self._disable(source, error)
            else:
                self.sources.append(source)
        if cupti_sources:
            self.sharing = CuptiSharing(
                emit=self.emitter.emit, clock=self._cupti_now, disable=self._disable,
                note=self._note, retry_s=float(self.config.probe.standby_retry), on_span_end=self._post_clock,
            )  # fmt: skip
            self.sources += self.sharing.start(cupti_sources)
            torch_profiler.listen(self.sharing)
        self._post_clock()
        self.control.start()  # after the sources: a window asked for now finds them started
        atexit.register(self._stop_at_exit)
        self._install_sigterm()
        return self

    # --- what the collector asks (``probe.control``; on the control thread) -------------------

    def _open_window(self, request: messages.OpenWindow) -> None:
        """``cuptistream trace``: every source that traces on demand (``plugin.OnDemand``) opens a
        window; the answer says how many, and why a source refused. Sources without the method are
        not asked; with none that can, the answer says ``windows=0`` and the CLI says so."""
        answer = messages.WindowAnswer(request=request.request)
        for source in list(self.sources):
            if not isinstance(source, OnDemand):
                continue
            try:
                if request.metrics:
                    windows = int(
                        source.open_window(request.seconds, request.request, metrics=request.metrics)
                    )
                else:  # plug-ins written before --metrics take two arguments
                    windows = int(source.open_window(request.seconds, request.request))
            except Exception as error:
                answer.refused[source.name] = str(error) or type(error).__name__
                continue
            if windows > 0:
                answer.windows += windows
                answer.opened.append(source.name)
        self.link.post(answer, wait=_ANSWER_WAIT_S)

    def _window_records(self, records: messages.WindowRecords) -> None:
        """What the collector decoded from one closed window: the source that traced it prices its
        next budget window with it (``governor.WindowPriced``)."""
        for source in list(self.sources):
            if isinstance(source, WindowPriced):
                source.window_records(records)

    def _post_clock(self) -> None:
        """A CUPTI clock reading for the collector; again after another tool had CUPTI (it may
        have given CUPTI another clock)."""
        if (clock := self.clock_sync()) is not None:
            self.link.post(messages.ClockReading(clock=clock))

    def _note(self, message: str) -> None:
        if not self.quiet:
            note(message)

    @staticmethod
    def _cupti_now() -> int:
        """CUPTI's clock, which needs no subscriber: yield spans line up with the records."""
        from cuptistream.cupti import driver

        try:
            return driver.timestamp()
        except Exception:
            return time.monotonic_ns()

    def _disable(self, source: Source, error: BaseException) -> None:
        self.governor.leave(source.name)
        message = str(error) or type(error).__name__
        self.failed_sources[source.name] = message
        self.emitter.report_error(f"source:{source.name}", f"source disabled: {message}")
        if not self.quiet:
            note(f"source {source.name!r} disabled: {message}")

    def clock_sync(self) -> ClockSync | None:
        """A CUPTI clock reading next to the Unix clock, from the first source that has a clock."""
        for source in self.sources:
            if source.clock is not None:
                try:
                    return ClockSync(cupti_ns=source.clock(), unix_ns=time.time_ns())
                except Exception:
                    continue
        return None

    def flush(self) -> None:
        for source in self.sources:
            try:
                source.flush()
            except Exception as error:
                self.emitter.report_error(f"source:{source.name}", f"flush failed: {error}")
        self.emitter.flush()

    def _stop_at_exit(self) -> None:
        self.stop()
        if self.sharing is not None and self.sharing.yields:
            # Another tool (Kineto) used CUPTI: detach it now, so that its callbacks do not run during
            # CUDA's own teardown after Python (Kineto's context-destroy callback then can free memory
            # twice, in a fair share of runs started with probe.start: process).
            from cuptistream.cupti import driver

            driver.detach_at_exit()

    def stop(self) -> None:
        """Stop the sources, send what they handed over, hang up. Idempotent; never raises."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        atexit.unregister(self._stop_at_exit)
        self._restore_sigterm()
        self.control.stop()
        # One deadline for all of it: a source blocked handing over (``block`` policy, a collector
        # that cannot take more) is released when it passes, its events counted lost. The
        # collector's deadline started with ours (the same signal): leave it time to close its sinks.
        deadline = float(self.config.pipeline.shutdown_deadline)
        deadline -= min(_COLLECTOR_CLOSE_S, deadline / 4)
        ends = time.monotonic() + deadline
        release = threading.Timer(deadline, self.emitter.give_up)
        release.daemon = True
        release.start()
        stopped: set[Source] = set()
        if self.sharing is not None:
            torch_profiler.forget(self.sharing)
            stopped = self.sharing.stop()
        for source in reversed(self.sources):
            if source in stopped:
                continue
            try:
                source.stop()
            except Exception as error:
                self.emitter.report_error(f"source:{source.name}", f"stop failed: {error}")
        self.emitter.close(max(0.0, ends - time.monotonic()))
        release.cancel()
        stats = {"activity_buffers": sum(o.buffers for o in self.emitter.outlets)}
        connected = self.link.connected
        self.link.close(stats, until=ends)
        unsent = self.link.unsent_losses()
        if (unsent or not connected) and not self.quiet:
            note(f"the collector at {self.link.address} was gone; not handed over: {unsent or 'nothing'}")

    def forget_after_fork(self) -> None:
        """In a forked child: this probe is the parent's. Mark it stopped without a word to the
        collector (the socket and shared memory are the parent's), and give SIGTERM back."""
        with self._lock:
            self._stopped = True
        self.control.stop()  # not running in the child (threads do not survive fork): a no-op
        if self.sharing is not None:
            torch_profiler.forget(self.sharing)
        self._restore_sigterm()

    # --- SIGTERM: unwind the program so the probe stops and hands over ----------------------

    def _install_sigterm(self) -> None:
        import signal

        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous_sigterm = signal.signal(signal.SIGTERM, _raise_system_exit)

    def _restore_sigterm(self) -> None:
        import signal

        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
