"""The library API: ``with cuptistream.session("cfg.yaml"): ...`` collects while the block runs.

A session is a probe in this process plus a collector:

- by default a collector process started for the session (decoding and sinks stay off the
  program's interpreter and its GIL);
- a running collector, when ``collector=`` (or ``CUPTISTREAM_COLLECTOR``, or ``probe.collector``)
  names its socket; that collector then owns the report;
- an embedded collector (threads in this process) when ``sinks=`` passes ready-made Sink
  instances, which cannot cross a process boundary.

Telemetry never takes the observed program down: a source that fails to start is disabled with an
Error event and a one-line note on stderr, and the others keep running.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from cuptistream import config as config_module
from cuptistream.channel.sockets import ENV_COLLECTOR, private_socket_path
from cuptistream.collector.collector import Collector
from cuptistream.collector.process import CollectorProcess
from cuptistream.config import Config
from cuptistream.overhead import Governor
from cuptistream.pipeline.core import ShutdownReport
from cuptistream.plugin import Emitter, Sink
from cuptistream.probe.probe import Probe

ConfigLike = str | Path | dict[str, Any] | Config


def _note(message: str) -> None:
    print(f"cuptistream: {message}", file=sys.stderr, flush=True)


class Session:
    """One telemetry session in this process. Not reusable: start() once, stop() once."""

    def __init__(
        self,
        config: ConfigLike,
        *,
        quiet: bool = False,
        sinks: list[Sink] | None = None,
        collector: str | None = None,
    ) -> None:
        self.config = config_module.load(config)
        self.session_id = os.environ.get("CUPTISTREAM_SESSION_ID") or uuid.uuid4().hex[:16]
        self.quiet = quiet
        self.report: ShutdownReport | None = None
        self._given_sinks = sinks
        self._address = collector or os.environ.get(ENV_COLLECTOR) or self.config.probe.collector
        self._embedded: Collector | None = None
        self._process: CollectorProcess | None = None
        self._probe: Probe | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def start(self) -> Session:
        cfg = self.config
        address = self._address
        if self._given_sinks is not None:
            self._embedded = Collector(
                cfg, sinks=self._given_sinks, session_id=self.session_id, in_program=True
            ).start()
            address = self._embedded.listen(private_socket_path())
        elif not address:
            self._process = CollectorProcess(cfg, self.session_id, quiet=self.quiet)
            address = self._process.address
        self._probe = Probe(cfg, address, self.session_id, quiet=self.quiet)
        try:
            self._probe.start()
        except BaseException:
            self._finish_collector()
            raise
        atexit.register(self.stop)  # after the probe's own: runs first, then drains the collector
        return self

    @property
    def sources(self) -> list[Any]:
        return self._probe.sources if self._probe else []

    @property
    def governor(self) -> Governor | None:
        """The overhead governor of the sampling sources (None before start): its throttles' plans
        and measured windows."""
        return self._probe.governor if self._probe else None

    @property
    def failed_sources(self) -> dict[str, str]:
        return self._probe.failed_sources if self._probe else {}

    @property
    def emitter(self) -> Emitter:
        assert self._probe is not None, "session not started"
        return self._probe.emitter

    def flush(self) -> None:
        if self._probe is not None:
            self._probe.flush()

    def stop(self) -> ShutdownReport | None:
        """Stop the probe (sources hand over what they hold), then let the collector drain. Idempotent."""
        with self._lock:
            if self._stopped:
                return self.report
            self._stopped = True
        atexit.unregister(self.stop)
        if self._probe is not None:
            self._probe.stop()
        self.report = self._finish_collector()
        if self._embedded is None and self._process is None:
            return None  # a running collector owns the report
        if self.report is None:
            _note("the collector did not finish draining in time; undelivered data is lost")
        elif not self.quiet:
            _note(f"session {self.session_id} drained: {self.report.summary()}")
        return self.report

    def _finish_collector(self) -> ShutdownReport | None:
        if self._embedded is not None:
            return self._embedded.finish(probe_timeout=self._embedded.stop_timeout)
        if self._process is not None:
            return self._process.wait(2 * float(self.config.pipeline.shutdown_deadline) + 10)
        return None

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def session(
    config: ConfigLike, *, quiet: bool = False, sinks: list[Sink] | None = None, collector: str | None = None
) -> Session:
    """A telemetry session for ``with``: starts on entry, drains on exit (also on an exception)."""
    return Session(config, quiet=quiet, sinks=sinks, collector=collector)
