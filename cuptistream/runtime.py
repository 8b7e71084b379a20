"""The in-process runtime: a Session starts the pipeline thread and the sources, and drains both.

``with cuptistream.session("cfg.yaml"): ...`` is the library API; ``cuptistream run`` wraps a
program in one. Telemetry never takes the observed program down: a source that fails to start is
disabled with an Error event and a one-line note on stderr, and the others keep running.
"""

from __future__ import annotations

import atexit
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from cuptistream import config as config_module
from cuptistream.component import Emitter, Sink, Source
from cuptistream.config import Config
from cuptistream.events import ClockSync
from cuptistream.pipeline import Pipeline, PipelineThread, ShutdownReport
from cuptistream.registry import sink_class, source_class
from cuptistream.resource import current_resource

ConfigLike = str | Path | dict[str, Any] | Config
_SHUTDOWN_GRACE_S = 5.0


def _note(message: str) -> None:
    print(f"cuptistream: {message}", file=sys.stderr, flush=True)


class Session:
    """One telemetry session in this process. Not reusable: start() once, stop() once."""

    def __init__(self, config: ConfigLike, *, quiet: bool = False, sinks: list[Sink] | None = None) -> None:
        """``sinks``: ready-made Sink instances to use instead of building the config's sinks (for
        embedding cuptistream with sinks constructed in code)."""
        self.config = config_module.load(config)
        self._given_sinks = sinks
        self.session_id = uuid.uuid4().hex[:16]
        self.quiet = quiet
        self.sources: list[Source] = []
        self.failed_sources: dict[str, str] = {}
        self.report: ShutdownReport | None = None
        self._pipeline_thread: PipelineThread | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._previous_sigterm: Any = None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Session:
        cfg = self.config
        sinks = self._given_sinks
        if sinks is None:
            sinks = [sink_class(s.type)(s) for s in cfg.sinks if s.enabled]
        resource = current_resource(cfg.session.job_env)
        pipeline = Pipeline(cfg, sinks, self.session_id, resource, self.clock_sync)
        self._pipeline_thread = PipelineThread(pipeline)
        self._pipeline_thread.start()  # raises SinkUnavailableError etc. before any source starts
        for source_config in cfg.sources:
            if not source_config.enabled:
                continue
            source = source_class(source_config.type)(source_config, pipeline.intake)
            try:
                source.start()
            except Exception as error:
                self._disable(source, error)
            else:
                self.sources.append(source)
        atexit.register(self.stop)
        self._install_sigterm()
        return self

    def _disable(self, source: Source, error: BaseException) -> None:
        message = str(error) or type(error).__name__
        self.failed_sources[source.name] = message
        self.emitter.report_error(f"source:{source.name}", f"source disabled: {message}")
        if not self.quiet:
            _note(f"source {source.name!r} disabled: {message}")

    def flush(self) -> None:
        for source in self.sources:
            try:
                source.flush()
            except Exception as error:
                self.emitter.report_error(f"source:{source.name}", f"flush failed: {error}")

    def stop(self) -> ShutdownReport | None:
        """Stop sources (each hands over what it holds), then drain the pipeline. Idempotent."""
        with self._lock:
            if self._stopped:
                return self.report
            self._stopped = True
        atexit.unregister(self.stop)
        self._restore_sigterm()
        for source in reversed(self.sources):
            try:
                source.stop()
            except Exception as error:
                self.emitter.report_error(f"source:{source.name}", f"stop failed: {error}")
        assert self._pipeline_thread is not None
        deadline = self.config.pipeline.shutdown_deadline + _SHUTDOWN_GRACE_S
        self.report = self._pipeline_thread.stop(deadline)
        if self.report is None:
            _note(f"pipeline did not stop within {deadline:.0f}s; undelivered data is lost")
        elif not self.quiet:
            _note(f"session {self.session_id} drained: {self.report.summary()}")
        return self.report

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- what sources and the pipeline use ----------------------------------------------------

    @property
    def emitter(self) -> Emitter:
        assert self._pipeline_thread is not None, "session not started"
        return self._pipeline_thread.pipeline.intake

    def clock_sync(self) -> ClockSync:
        """A reading of the event clock (CUPTI's when a CUPTI source runs) next to the Unix clock."""
        for source in self.sources:
            if source.clock is not None:
                try:
                    return ClockSync(cupti_ns=source.clock(), unix_ns=time.time_ns())
                except Exception:
                    continue
        return ClockSync(cupti_ns=time.monotonic_ns(), unix_ns=time.time_ns())

    # --- SIGTERM: unwind the program so the session drains ------------------------------------

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous_sigterm = signal.signal(signal.SIGTERM, _raise_system_exit)

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def session(config: ConfigLike, *, quiet: bool = False, sinks: list[Sink] | None = None) -> Session:
    """A telemetry session for ``with``: starts on entry, drains on exit (also on an exception)."""
    return Session(config, quiet=quiet, sinks=sinks)
