"""A cuptistream source from outside the project: the host's load average every ``interval``, as
``activity`` events of kind ``loadavg``. It uses no CUDA, so the probe starts with the process.

Written from docs/architecture.md ("Writing a source") only, as a tool builder would.
"""

from __future__ import annotations

import os
import threading
import time

from cuptistream.plugin import Duration, Source, SourceConfig, events


class LoadAverageConfig(SourceConfig):
    """``type: loadavg``."""

    interval: Duration = Duration(0.1)
    samples: int = 0  # stop after this many; 0: until the session stops

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError("interval must be positive, e.g. 100ms")


class LoadAverageSource(Source):
    config_type = LoadAverageConfig
    traces_cuda = False
    config: LoadAverageConfig

    def start(self) -> None:
        self.taken = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadavg", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            one, five, fifteen = os.getloadavg()
            sample = events.Activity(
                kind="loadavg",
                fields={"unix_ns": time.time_ns(), "load1": one, "load5": five, "load15": fifteen},
            )
            self.emitter.emit([sample])
            self.taken += 1
            if self.config.samples and self.taken >= self.config.samples:
                return
            self._stopping.wait(self.config.interval)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
